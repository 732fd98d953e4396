"""--n-cpu-moe over several devices: the layer split is searched along with N.

llama.cpp splits the layers over the devices by their free memory unless -ts says otherwise,
and --n-cpu-moe takes the experts of the first N layers, which that split gives to the first
device: with 48 GiB + 24 GiB the first device holds two thirds of the layers, and once their
experts are on the CPU it is nearly empty while the second is full. The fewest expert layers
on the CPU come with a split of their own, which the line to paste states as -ts in layers
per device (a count per device is an exact layer boundary in llama.cpp's float32 split).

Exact on measured figures, with a few reserves:
* For a given N a device's total depends on its own run of layers (their weights and KV, and
  its compute buffer) and grows with it, so whether any split fits is decided greedily: the
  first device takes the most layers it can hold, the next the most after those, ..., the last
  the rest. A split that fits ends every device's run no later than the greedy one (induction
  over the devices: a run that starts no later and ends later holds more), so it leaves the
  last device at least the greedy's layers: if the greedy's last device misses, every split
  misses.
* "The most layers it can hold" is measured: it fits, and one layer more does not. A model of
  the bytes per layer (the header's weights, less the experts of layers below N, plus the KV
  per layer of a reserve) and of each device's fixed part (set again by every reserve) guesses
  the split first; a split that fits needs one reserve, a proof that none does about two per
  device.
* Fitting only gets easier as N grows (each layer's bytes on the devices shrink), so N is
  bracketed (no split fits at miss_lo; one does at fit_hi) from the model's smallest N.
"""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.models.fit.core import FitBackend, Prober


class _SplitModel:
    """Each device's bytes for a run of layers at N: the layers' bytes plus a fixed part that
    every reserve sets again (the compute buffer and what the model leaves out)."""

    def __init__(self, costs: dict[int, int], experts: dict[int, int], n_max: int,
                 devices: list[int]):
        self.costs, self.experts, self.n_max, self.devices = costs, experts, n_max, devices
        self.start = 0                        # the first layer on the devices (n_max - ngl)
        self.kv = 0.0
        self.room = [0.0] * len(devices)      # memory less margin less the fixed part

    def layer(self, il: int, n: int) -> float:
        n_layer = self.n_max - 1
        return (self.costs.get(il, 0) - (self.experts.get(il, 0) if il < n else 0)
                + (self.kv if il < n_layer else 0))

    def learn(self, rows: list[FitBackend], ends: tuple[int, ...], n: int) -> None:
        devs = [rows[i] for i in self.devices]
        repeating = self.n_max - 1 - self.start        # layers with KV on the devices
        if repeating > 0:
            self.kv = sum(r.kv_bytes + r.state_bytes for r in devs) / repeating
        for d, (r, (s, e)) in enumerate(zip(devs, _runs(ends, self.n_max, self.start))):
            held = sum(self.layer(il, n) for il in range(s, e))
            self.room[d] = r.memory_bytes - r.margin_bytes - (r.total_bytes - held)

    def longest(self, d: int, start: int, n: int) -> int:
        """The end of the longest run from `start` device d holds, as modeled."""
        used, end = 0.0, start
        while end < self.n_max and used + self.layer(end, n) <= self.room[d]:
            used += self.layer(end, n)
            end += 1
        return end

    def greedy(self, n: int) -> tuple[tuple[int, ...], bool]:
        """The greedy split's ends (devices but the last) and whether the last fits, modeled."""
        ends, start = [], self.start
        for d in range(len(self.devices) - 1):
            start = self.longest(d, start, n)
            ends.append(start)
        rest = sum(self.layer(il, n) for il in range(start, self.n_max))
        return tuple(ends), rest <= self.room[-1]


def _runs(ends: tuple[int, ...], n_max: int, start: int = 0) -> list[tuple[int, int]]:
    bounds = (start, *ends, n_max)
    return list(zip(bounds[:-1], bounds[1:]))


def split_of(ends: tuple[int, ...], n_max: int, start: int = 0) -> tuple[float, ...]:
    """-ts as layers per device (of the layers from `start` on: -ngl n_max - start)."""
    return tuple(float(e - s) for s, e in _runs(ends, n_max, start))


class _Search:
    def __init__(self, probe: Prober, ctx: int, n_max: int, model: _SplitModel):
        self.probe, self.ctx, self.n_max, self.model = probe, ctx, n_max, model

    def rows(self, n: int, ends: tuple[int, ...], complete: bool = False) -> list[FitBackend]:
        start = self.model.start
        rows = self.probe.full(self.n_max - start, self.ctx, n,
                               split_of(ends, self.n_max, start), complete=complete)[0]
        self.model.learn(rows, ends, n)
        return rows

    def fits(self, n: int, ends: tuple[int, ...], d: int) -> bool:
        """Device d alone: a reserve cut short (another device already short) says only that
        a short device is short, so one where d fits is completed."""
        i = self.model.devices[d]
        return self.rows(n, ends)[i].fits and self.rows(n, ends, complete=True)[i].fits

    def split(self, n: int) -> tuple[int, ...] | None:
        """The ends of a split that fits at N (measured), or None when none does (proved)."""
        ends, _ = self.model.greedy(n)
        if all(self.rows(n, ends)[i].fits for i in self.model.devices):
            return ends
        done: tuple[int, ...] = ()
        k = len(self.model.devices)
        for d in range(k - 1):
            start = done[-1] if done else self.model.start
            end = self.longest(n, done, d, start)
            if end is None:
                return None
            done += (end,)
        return done if all(self.rows(n, done)[i].fits for i in self.model.devices) else None

    def longest(self, n: int, done: tuple[int, ...], d: int, start: int) -> int | None:
        """The most layers device d holds from `start` (its run's end), measured: the later
        devices but the last hold nothing meanwhile. None: not even an empty run fits."""
        k = len(self.model.devices)

        def ends(e: int) -> tuple[int, ...]:
            return done + (e,) * (k - 1 - d)

        fit_lo, miss_hi = None, self.n_max + 1      # fits ending at fit_lo; misses at miss_hi
        rounds = 0
        while True:
            lo = start if fit_lo is None else fit_lo + 1
            if lo >= miss_hi:
                return fit_lo
            rounds += 1                               # the model's guess twice, then bisect
            guess = (self.model.longest(d, start, n) if rounds <= 2
                     else (lo + miss_hi - 1) // 2)
            guess = min(max(guess, lo), miss_hi - 1)
            for e in (guess, guess + 1):
                if e >= miss_hi:
                    break
                if self.fits(n, ends(e), d):
                    fit_lo = e            # and one layer more right away: usually the edge
                else:
                    miss_hi = e
                    break


def moe_split_fit(probe: Prober, ctx: int, n_max: int, costs: dict[int, int],
                  experts: dict[int, int], lo: int,
                  first: list[FitBackend]) -> tuple[int, tuple[float, ...]] | None:
    """The smallest N in [lo, n_layer] at which some split of every layer over the devices
    fits, and that split (-ts, layers per device); None when not even N = n_layer does.
    `first`: the reserve at N = lo with the split llama.cpp would make (it calibrates)."""
    from ggmlrun.models.memory.placement import place

    devices = [i for i, b in enumerate(probe.backends) if b.kind != "cpu"]
    model = _SplitModel(costs, experts, n_max, devices)
    placed = place(probe.model.hparams, probe.model.tensors, probe.backends,
                   replace(probe.opts, ngl=n_max, n_cpu_moe=lo, tensor_split=None))
    layers = placed.layer + [placed.output]
    model.learn(first, tuple(sum(1 for b in layers if b in devices[:d + 1])
                             for d in range(len(devices) - 1)), lo)
    search = _Search(probe, ctx, n_max, model)
    n_layer = n_max - 1
    miss_lo, fit_hi, answer = lo - 1, None, None
    while True:
        top = fit_hi if fit_hi is not None else n_layer + 1
        if top - miss_lo <= 1:
            break
        guess = next((n for n in range(miss_lo + 1, top) if model.greedy(n)[1]), top - 1)
        ends = search.split(guess)
        if ends is not None:
            fit_hi, answer = guess, ends
        else:
            miss_lo = guess
    if fit_hi is None:
        return None
    return fit_hi, split_of(answer, n_max)
