"""N-gram tables: the memory-mapped store (store), building and importing tables (build), the
Python reference of the lookups (reference), and the command line (``python -m dart_core.ngram``)."""
