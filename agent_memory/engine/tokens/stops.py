"""Stop strings, enforced on the decoded text: a stop may span several tokens, so text that
could be the start of one is held back until it is known not to be."""


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None  # the stop string reached, once one is

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was reached)."""
        buf = self.pending + text
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])  # the earliest; the first listed on a tie
            self.pending = ""
            return buf[:at], True
        hold = max((self._overlap(buf, s) for s in self.stops), default=0)
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text

    @staticmethod
    def _overlap(buf: str, stop: str) -> int:
        """Length of the longest end of `buf` that begins `stop`."""
        for n in range(min(len(buf), len(stop) - 1), 0, -1):
            if buf.endswith(stop[:n]):
                return n
        return 0
