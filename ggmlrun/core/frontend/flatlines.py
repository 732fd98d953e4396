"""Line numbers for a file the fast YAML reader (yamlfast.py) read: every error names the line
of the key or item it blames, but a 100k-node file would need a dict entry per scalar for it.
A flow collection sits on one line, so the block-level entries' lines are enough; FlatLines
answers lookups as the full parser's {path: line} dict does.
"""

from __future__ import annotations


class FlatLines:
    """The line of every key and item of a file the fast reader read, without a dict entry for
    each: a flow collection sits on one line, so everything inside a block-level entry shares
    that entry's line. Behaves as the full parser's {path: line} dict does for lookups."""

    def __init__(self, data, shallow: dict, root_line: int):
        self._data = data
        self._shallow = shallow
        self._root = root_line

    def get(self, path: tuple, default=None):
        if not path:
            return self._root
        line = self._shallow.get(path)      # a block-level key or item: the common question
        if line is not None:
            return line
        for depth in (2, 1):
            base = path[:depth]
            line = self._shallow.get(base) if len(path) >= depth else None
            if line is not None:
                break
        else:
            return default
        value = self._data[base[0]]
        if depth == 2:
            value = value[base[1]]
        for part in path[depth:]:
            if isinstance(value, dict):
                if part not in value:
                    return default
                value = value[part]
            elif isinstance(value, list) and part in range(len(value)):
                value = value[int(part)]
            else:
                return default
        return line

    def __contains__(self, path) -> bool:
        return self.get(path) is not None

    def __getitem__(self, path):
        line = self.get(path)
        if line is None:
            raise KeyError(path)
        return line

    def __bool__(self) -> bool:
        return True

    def as_dict(self) -> dict:
        """Every path the full parser would record, with its line (for tests and comparisons)."""
        out = {(): self._root}

        def walk(path, value, line):
            if isinstance(value, dict):
                items = value.items()
            elif isinstance(value, list):
                items = enumerate(value)
            else:
                return
            for key, sub in items:
                here = path + (key,)
                here_line = self._shallow.get(here, line)
                out[here] = here_line
                walk(here, sub, here_line)

        walk((), self._data, self._root)
        return out

    def __eq__(self, other) -> bool:
        mine = self.as_dict()
        return mine == (other.as_dict() if isinstance(other, FlatLines) else other)

    __hash__ = None
