"""Draft heads: DART (dart) and the EAGLE-3 baseline (eagle3)."""
