"""Target model loading and the tree-verifying target wrapper."""
