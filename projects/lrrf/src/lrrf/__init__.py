"""lrrf."""
