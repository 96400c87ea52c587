"""The deployment runtime: image in, caption out. Never imports torch (DESIGN.md §2)."""
