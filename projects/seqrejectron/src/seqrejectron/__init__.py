"""seqrejectron."""
