"""A weighted mixture of prepared datasets as one exactly resumable training stream (`data.train` a mapping).

The schedule. Every row of the run has a global index j (0, 1, 2, ... over all batches, stages and
processes). Row j comes from dataset `domain(j)`: splitmix64 of (seed, j), a counter-based hash, read as a
uniform u in [0, 1) and looked up in the cumulative weights. It is fixed by the seed alone: no state to
carry, the same on every process, after any restore and at any batch shape; a dataset's share over n rows
is its weight within binomial noise (sd sqrt(w(1-w)/n)).

Each dataset is its own shuffled G-lane stream (`loader.TokenStream`, `loader.Lanes`: a new document order
every epoch, lanes so that rows come from many places of the corpus). Its n-th row (n counted over the run)
comes from lane n mod G at that lane's offset o: tokens [o, o + L + 1), `inputs = row[:-1]`, `targets =
row[1:]`, and the lane moves to o + L. Inside a lane consecutive rows overlap by one token, so every token of
a dataset is a target once per epoch whatever the stages' L. The whole position is the row counter plus, per
dataset, its row count and G lane offsets (`get_state()`, JSON, saved in every checkpoint); the tokens a
dataset gave are the sum of its lane offsets, which is what `domain_tokens()` (and the metrics' per-window
`data/share/<name>`) report.

Grain: batch k of a stage is a pure function of (position at stage start, k, shape), as for one dataset
(`loader.BatchStream`); the position before batch k is found by replaying the schedule of the batches
before it (O(B) per batch in order, cached).
"""
from __future__ import annotations

import numpy as np

from yxanul_jax.core.errors import UserError
from yxanul_jax.data.dataset import PreparedDataset, same_dataset
from yxanul_jax.data.loader import MIXTURE_STATE_KIND, BatchStream, Lanes, TokenStream

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SCHEDULE_SALT = 0x6D69787475726521  # "mixture!": the schedule's stream differs from the shuffle's


def _splitmix64(x_N: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of uint64[N] (wrapping arithmetic)."""
    z = x_N.astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_domains(seed: int, weights: list[float], start: int, n: int) -> np.ndarray:
    """Dataset index (into `weights`, which sum to 1) of rows [start, start + n) of the run: int64[n]."""
    key = _splitmix64(np.array([(int(seed) ^ _SCHEDULE_SALT) % 2**64], dtype=np.uint64))[0]
    j_N = np.arange(start, start + n, dtype=np.uint64)
    u_N = (_splitmix64(key + j_N * _GOLDEN) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    cum_D = np.cumsum(weights)
    return np.minimum(np.searchsorted(cum_D, u_N, side="right"), len(weights) - 1).astype(np.int64)


class _Position:
    """Rows taken so far (`row`) and per dataset its rows (`rows_D`) and lane offsets (`offsets_DxG`)."""

    def __init__(self, row: int, rows_D: np.ndarray, offsets_DxG: np.ndarray):
        self.row, self.rows_D, self.offsets_DxG = row, rows_D, offsets_DxG

    def copy(self) -> "_Position":
        return _Position(self.row, self.rows_D.copy(), self.offsets_DxG.copy())

    def places(self, domains_N: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(lane int64[N], lane offset int64[N]) of each of the next N rows, whose datasets are `domains_N`."""
        G = self.offsets_DxG.shape[1]
        lane_N = np.empty(len(domains_N), np.int64)
        offset_N = np.empty(len(domains_N), np.int64)
        for d in np.unique(domains_N):
            at = np.flatnonzero(domains_N == d)
            i_M = np.arange(len(at))
            lane_N[at] = (self.rows_D[d] + i_M) % G
            offset_N[at] = self.offsets_DxG[d, lane_N[at]] + seq_len * (i_M // G)  # i // G earlier rows of the lane
        return lane_N, offset_N

    def advance(self, domains_N: np.ndarray, seq_len: int, lane_N: np.ndarray | None = None) -> None:
        """Move past N rows of length seq_len, whose datasets are `domains_N` (and lanes `lane_N`, from
        `places`, when the caller has them)."""
        if lane_N is None:
            lane_N, _ = self.places(domains_N, seq_len)
        np.add.at(self.offsets_DxG, (domains_N, lane_N), seq_len)
        self.rows_D += np.bincount(domains_N, minlength=len(self.rows_D))
        self.row += len(domains_N)


class _MixtureBatchAt:
    """Batch k of a stage: a pure function of k (pickled into Grain worker processes)."""

    def __init__(self, readers: list[Lanes], seed: int, weights: list[float], start: _Position, seq_len: int,
                 batch_size: int, process_index: int, process_count: int):
        self.readers, self.seed, self.weights = readers, seed, weights
        self.start, self.seq_len, self.batch_size = start, seq_len, batch_size
        local = batch_size // process_count
        self.rows = (process_index * local, (process_index + 1) * local)  # global rows [r0, r1)
        self._cached = (0, start.copy())  # (k, position before batch k): batches are asked for in order

    def domains(self, pos: _Position) -> np.ndarray:
        return row_domains(self.seed, self.weights, pos.row, self.batch_size)

    def position(self, k: int) -> _Position:
        """The position before batch k of the stage."""
        k0, pos = self._cached
        if k < k0:
            k0, pos = 0, self.start
        pos = pos.copy()
        for _ in range(k0, k):
            pos.advance(self.domains(pos), self.seq_len)
        self._cached = (k, pos)
        return pos

    def __call__(self, k: int) -> dict:
        L, (r0, r1) = self.seq_len, self.rows
        pos = self.position(k)
        domains_B = self.domains(pos)
        lane_B, offset_B = pos.places(domains_B, L)
        inputs = np.empty((r1 - r0, L), np.int32)
        targets = np.empty((r1 - r0, L), np.int32)
        mask = np.empty((r1 - r0, L), np.float32)
        for i, r in enumerate(range(r0, r1)):
            tokens_N, real_N = self.readers[domains_B[r]].read(int(lane_B[r]), int(offset_B[r]), L + 1)
            inputs[i], targets[i], mask[i] = tokens_N[:-1], tokens_N[1:], real_N[1:]
        cursor = np.int64(pos.row)
        pos.advance(domains_B, L, lane_B)  # the position before batch k + 1, from this batch's own schedule
        self._cached = (k + 1, pos)
        # the stream moves past this batch with its schedule, instead of drawing it again (`MixtureStream._advance`)
        advance = {"domains": domains_B.astype(np.int32), "lanes": lane_B.astype(np.int32)}
        return {"inputs": inputs, "targets": targets, "mask": mask, "cursor": cursor, "advance": advance}


class MixtureStream(BatchStream):
    """Infinite packed training batches whose rows are drawn from several prepared datasets by weight
    (module docstring); the interface of `loader.TrainStream`, plus `domain_tokens()`."""

    def __init__(self, datasets: dict[str, PreparedDataset], weights: dict[str, float], *, seed: int,
                 lanes: int = 1, process_index: int = 0, process_count: int = 1, num_workers: int = 0,
                 prefetch: int = 2):
        super().__init__(process_index=process_index, process_count=process_count, num_workers=num_workers,
                         prefetch=prefetch)
        if not datasets or set(weights) != set(datasets) or not all(w > 0 for w in weights.values()):
            raise UserError(f"a mixture needs one positive weight per dataset (datasets: {', '.join(datasets)}; "
                            f"weights: {weights}); set data.weights")
        self.datasets, self.seed = dict(datasets), int(seed)
        self.names = list(datasets)
        total = sum(weights.values())
        self.weights = {n: weights[n] / total for n in self.names}
        self.readers = []
        for name, ds in datasets.items():
            try:
                self.readers.append(Lanes(TokenStream(ds.split("train"), ds.eos_id, self.seed), lanes))
            except UserError as e:
                raise UserError(f"data.train.{name} ('{ds.path}'): {e}") from None
        self.lanes = lanes
        self.pos = _Position(0, np.zeros(len(self.names), np.int64), np.zeros((len(self.names), lanes), np.int64))

    def batch_fn(self, seq_len: int, batch_size: int) -> _MixtureBatchAt:
        """Batch k (k = 0, 1, ...) of shape (seq_len, batch_size) from the current position, as a function."""
        if seq_len < 1 or batch_size < 1 or batch_size % self.process_count:
            raise UserError(f"batch_size {batch_size} must be a positive multiple of the process count "
                            f"{self.process_count}, and seq_len {seq_len} positive")
        return _MixtureBatchAt(self.readers, self.seed, [self.weights[n] for n in self.names], self.pos.copy(),
                               seq_len, batch_size, self.process_index, self.process_count)

    @property
    def position(self) -> int:
        return self.pos.row

    def _advance(self, seq_len: int, batch_size: int, advance: dict | None = None) -> None:
        # the delivered batch's own datasets and lanes (`_MixtureBatchAt`): its schedule is not drawn again here
        self.pos.advance(advance["domains"].astype(np.int64), seq_len, advance["lanes"].astype(np.int64))

    def domain_tokens(self) -> dict[str, int]:
        """name -> tokens (rows x their length) drawn from that dataset so far, over all processes."""
        return {n: int(self.pos.offsets_DxG[d].sum()) for d, n in enumerate(self.names)}

    @property
    def tokens_consumed(self) -> int:
        """Target tokens delivered so far, over all processes."""
        return int(self.pos.offsets_DxG.sum())

    def get_state(self) -> dict:
        """JSON-serializable exact position (the same on every process)."""
        domains = {}
        for d, n in enumerate(self.names):
            offsets = [int(o) for o in self.pos.offsets_DxG[d]]
            domains[n] = {"rows": int(self.pos.rows_D[d]), "offsets": offsets, "tokens": sum(offsets),
                          "epoch": min(offsets) // self.readers[d].lane_len,
                          "dataset": self.datasets[n].fingerprint("train")}
        return {"kind": MIXTURE_STATE_KIND, "version": 1, "rows": self.pos.row, "tokens_consumed": self.tokens_consumed,
                "seed": self.seed, "lanes": self.lanes, "weights": dict(self.weights), "domains": domains}

    def set_state(self, state: dict) -> None:
        """Continue from a `get_state()` result; UserError if it belongs to another seed, mixture or data."""
        if not isinstance(state, dict) or state.get("kind") != MIXTURE_STATE_KIND \
                or not isinstance(state.get("rows"), int) or not isinstance(state.get("domains"), dict):
            raise UserError("saved data-stream state is not of a mixture (data.train was one dataset); resume "
                            "with the same data.train")
        saved = list(state["domains"])
        if saved != self.names:
            raise UserError(f"saved data-stream state is of the mixture {', '.join(saved)} but data.train names "
                            f"{', '.join(self.names)}; resume with the same data.train")
        self._check_resume(state, self.seed, state.get("lanes"), self.lanes)
        if state.get("weights") != self.weights:
            raise UserError(f"saved data-stream state drew by the weights {state.get('weights')} but this run by "
                            f"{self.weights}; set the same data.weights to resume exactly")
        for n in self.names:
            info = state["domains"][n]
            if not same_dataset(info.get("dataset"), self.datasets[n].fingerprint("train")):
                raise UserError(f"saved data-stream state of data.train.{n} belongs to another dataset than "
                                f"'{self.datasets[n].path}' (its documents, their order or the tokenizer differ); "
                                "resume with the same data.train")
            if len(info.get("offsets", ())) != self.lanes:
                raise UserError(f"saved data-stream state of data.train.{n} is damaged; restore it from the same "
                                "run's checkpoint")
        self.close()
        self.pos = _Position(int(state["rows"]), np.array([state["domains"][n]["rows"] for n in self.names], np.int64),
                             np.array([state["domains"][n]["offsets"] for n in self.names], np.int64))
