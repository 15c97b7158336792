"""The images of recorded requests, as the requests carried them: never fetched.

The proxy names each image by a sha256: of the decoded bytes for a data URL, of the URL's text for an
http(s) URL (faithcore/images.py). A trace keeps only that hash; a report also keeps the data URL when
the proxy kept images. So an image is at hand when the report carried its data URL, or when a folder
the user names (`--images DIR`) holds a file whose bytes hash to it, the file the client sent. An image
that was a URL is not at hand: the exporter never goes to the network for it, and its pair is left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from faithproxy.flywheel.records import Recorded

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


class ImageIndex:
    """sha256 of the bytes -> the file, for every image file under the given folders (read once)."""

    def __init__(self, folders: Iterable[Path] = ()) -> None:
        self.files: dict[str, Path] = {}
        for folder in folders:
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
                    self.files.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), path)

    def resolve(self, recorded: Recorded) -> list[str] | None:
        """Each image of the request as a data URL (the report's) or a file path; None when one is not at hand."""
        found = []
        for sha in recorded.image_hashes:
            if sha in recorded.image_urls:
                found.append(recorded.image_urls[sha])
            elif sha in self.files:
                found.append(str(self.files[sha]))
            else:
                return None
        return found
