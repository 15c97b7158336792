"""Detectors: decide, step by step, whether a perception step describes the image faithfully."""
