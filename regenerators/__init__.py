"""Regenerators: rewrite one unfaithful step so that it matches the image."""
