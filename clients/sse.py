"""Incremental decoder for server-sent events, shaped like httpx's LineDecoder: pure `feed`/`flush`.

Only the `data` field matters for OpenAI-style streams; comments (`:` lines) and other fields are
skipped. Any split of the byte stream yields the same events.
"""

from __future__ import annotations


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []
        self._pending_cr = False

    def feed(self, text: str) -> list[str]:
        """Returns the `data` payload of every event completed by `text`."""
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]  # the \n of a \r\n that was split across chunks
        self._pending_cr = text.endswith("\r")
        self._buffer += text.replace("\r\n", "\n").replace("\r", "\n")
        events: list[str] = []
        while True:
            line, sep, rest = self._buffer.partition("\n")
            if not sep:
                break
            self._buffer = rest
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[str]:
        events = []
        if self._buffer:
            event = self._line(self._buffer)
            self._buffer = ""
            if event is not None:
                events.append(event)
        if self._data:  # a stream that ended without the blank line after its last event
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            event = "\n".join(self._data)
            self._data = []
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


class SSEBytesDecoder:
    """SSEDecoder over bytes, for the proxy's hot path: events stay bytes (json.loads reads them as they
    are), lines are split in one pass, and a `data: ` line, the only kind vLLM sends, takes no parsing
    beyond a prefix test. Same events as SSEDecoder for the same stream, however it is split."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._pending_cr = False

    def feed(self, data: bytes) -> list[bytes]:
        """Returns the `data` payload of every event completed by `data`."""
        if self._pending_cr and data[:1] == b"\n":
            data = data[1:]  # the \n of a \r\n that was split across chunks
        self._pending_cr = data[-1:] == b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._buffer:
            data = self._buffer + data
        lines = data.split(b"\n")
        self._buffer = lines.pop()
        events: list[bytes] = []
        pending = self._data
        for line in lines:
            if not line:
                if pending:
                    events.append(pending[0] if len(pending) == 1 else b"\n".join(pending))
                    pending.clear()
            elif line[:6] == b"data: ":
                pending.append(line[6:])
            elif line[:1] != b":":
                name, _, value = line.partition(b":")
                if name == b"data":
                    pending.append(value[1:] if value[:1] == b" " else value)
        return events

    def flush(self) -> list[bytes]:
        events = []
        if self._buffer:
            buffered, self._buffer = self._buffer, b""
            events += self.feed(buffered + b"\n")
        if self._data:  # a stream that ended without the blank line after its last event
            events.append(b"\n".join(self._data))
            self._data.clear()
        return events
