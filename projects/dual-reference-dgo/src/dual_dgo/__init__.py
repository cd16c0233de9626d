"""Dual-Reference DGO: offline adaptive fast/slow reasoning for VLMs."""
