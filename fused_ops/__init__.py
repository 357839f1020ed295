"""Fused operators applied by perfscope's acceleration runtime."""
