"""Streaming prepared token shards: packed training batches (Grain) and one-pass validation batches.

The dataset read here is opened by `yxanul_jax.data.dataset` (files named in `yxanul_jax.data.layout`):
token files are memory-mapped; only the per-document offsets are held in memory, never the corpus.

The stream. One epoch is the split's documents in a seeded order (`np.random.default_rng([seed,
epoch]).permutation`, a fresh order every epoch), each preceded by EOS: `EOS d0 EOS d1 EOS d2 ...`
(EOS separates documents and acts as BOS), T tokens. Epochs follow each other forever.

Lanes: so that the rows of one batch come from many documents, not from one long book, each epoch is
cut into G equal lanes of `Lane = ceil(T / G)` positions (lane g holds epoch positions [g*Lane,
(g+1)*Lane); the last lane's tail past T is padding: EOS, never a target), and a batch reads all
lanes side by side. A batch of B rows (B a multiple of G; R = B / G rows per lane) of `seq_len + 1`
tokens at cursor c reads lane offsets [o, o + R*L + 1) of every lane, o = c / G; row r = i*G + g is
lane g's window [o + i*L, o + i*L + L + 1): `inputs = row[:-1]`, `targets = row[1:]`, and the cursor
moves to `c + B*L`. A lane runs on into the same lane of the next epoch; with G > 1 the first token of each
of its epochs is context only (the token before it ended the lane's stretch of the previous epoch, somewhere
in another document: no target across that seam). Inside a lane consecutive rows overlap by one token, so
every other token is a target exactly once per epoch. G = 1 is the plain stream. The whole position is that one
integer cursor (G is fixed for the run), hence:
  * exact save/restore: `get_state()` is `{"cursor": c, "lanes": G, ...}`; any restore replays the
    same batches;
  * a curriculum stage change (new seq_len / batch_size, still a multiple of G) just reads on from
    `c`: no document is skipped or repeated;
  * process sharding: process p of P takes rows [p*B/P, (p+1)*B/P) of every global batch, reading
    only its own tokens; all processes keep the same cursor.

Grain's role: the batch at step k of a stage is a pure function of (cursor at stage start, k,
shape), so each stage is a `grain.MapDataset.range(...).map(batch_at)` turned into an iterator with
thread prefetch, and with `num_workers > 0` computed in worker processes by `mp_prefetch`. A stage
change or a restore starts a new Grain iterator at the cursor; prefetched batches are simply
dropped, so nothing depends on Grain's own iterator state.
"""
from __future__ import annotations

import math
from typing import Iterator

import grain
import numpy as np

from yxanul_jax.core.errors import UserError
from yxanul_jax.data.dataset import PreparedDataset, SplitIndex, open_dataset, same_dataset

_STATE_KIND = "yxanul-train-stream"
MIXTURE_STATE_KIND = "yxanul-mixture-stream"
"""The `kind` of a mixture's saved state (`yxanul_jax.data.mixture`), told apart from a single stream's here."""
_EPOCHS_CACHED = 2


# --------------------------------------------------------------------------------------------
# The packed token stream


class TokenStream:
    """Random access to a split's packed stream `EOS d EOS d ...`, shuffled per epoch by `seed`.

    seed=None keeps the stored order. A finite stream (`finite`; default: seed=None) is one epoch,
    `length` tokens; positions past the end read as EOS (callers mask them).
    """

    def __init__(self, index: SplitIndex, eos_id: int, seed: int | None, finite: bool | None = None):
        self.index, self.eos_id, self.seed = index, eos_id, seed
        self.finite = seed is None if finite is None else finite
        self.length = index.num_documents + index.num_tokens  # tokens per epoch
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __getstate__(self):
        return {**self.__dict__, "_epochs": {}}

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Document ids in the order epoch `epoch` visits them (int64[num_documents])."""
        n = self.index.num_documents
        if self.seed is None:
            return np.arange(n)
        return np.random.default_rng([self.seed % 2**63, epoch]).permutation(n)

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if epoch not in self._epochs:
            if len(self._epochs) >= _EPOCHS_CACHED:
                self._epochs.pop(min(self._epochs))
            order = self.epoch_order(epoch)
            self._epochs[epoch] = (order, np.cumsum(self.index.lengths[order] + 1))
        return self._epochs[epoch]

    def read(self, start: int, n: int) -> np.ndarray:
        """Stream tokens [start, start + n) as int32[n]."""
        out = np.empty(n, dtype=np.int32)
        lengths, filled, pos = self.index.lengths, 0, start
        while filled < n:
            epoch, p = divmod(pos, self.length)
            if self.finite and epoch > 0:
                out[filled:] = self.eos_id
                break
            order, ends = self._epoch(epoch)
            i = int(np.searchsorted(ends, p, side="right"))  # the unit (EOS + document) holding p
            while filled < n and i < len(order):
                doc = int(order[i])
                o = p - (int(ends[i]) - int(lengths[doc]) - 1)  # offset inside the unit; 0 is its EOS
                if o == 0:
                    out[filled] = self.eos_id
                    filled, p, pos, o = filled + 1, p + 1, pos + 1, 1
                take = min(n - filled, int(lengths[doc]) - (o - 1))
                out[filled:filled + take] = self.index.doc_slice(doc, o - 1, o - 1 + take)
                filled, p, pos = filled + take, p + take, pos + take
                i += 1
        return out

    def documents(self, start: int, n: int) -> np.ndarray:
        """Document id of stream positions [start, start + n) (an EOS belongs to the document it opens)."""
        pos_N = np.arange(start, start + n, dtype=np.int64)
        epoch_N, p_N = np.divmod(pos_N, self.length)
        out_N = np.empty(n, dtype=np.int64)
        for epoch in np.unique(epoch_N):
            order, ends = self._epoch(int(epoch))
            sel = epoch_N == epoch
            out_N[sel] = order[np.searchsorted(ends, p_N[sel], side="right")]
        return out_N


class Lanes:
    """The G-lane view of a shuffled stream (module docstring): lane offsets to tokens, padding marked."""

    def __init__(self, stream: TokenStream, lanes: int):
        if lanes < 1:
            raise UserError(f"data.lanes must be >= 1, got {lanes}")
        if stream.length < 2 * lanes:
            raise UserError(f"the training split has {stream.length:,} tokens, too few for {lanes} lanes; "
                            "set data.lanes smaller or use a larger dataset")
        self.stream, self.lanes = stream, lanes
        self.lane_len = -(-stream.length // lanes)
        self.epoch_len = lanes * self.lane_len  # cursor units (padding included) per epoch

    def _pieces(self, g: int, o: int, n: int):
        """(out offset, stream position, count, whether it starts the lane's epoch) of the real stretches of lane g's
        offsets [o, o + n)."""
        T, filled = self.stream.length, 0
        while filled < n:
            epoch, q = divmod(o + filled, self.lane_len)
            take = min(n - filled, self.lane_len - q)
            p = g * self.lane_len + q
            real = max(0, min(take, T - p))
            if real:
                yield filled, epoch * T + p, real, q == 0
            filled += take

    def read(self, g: int, o: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int32[n], target bool[n]) of lane g's offsets [o, o + n); padding reads as EOS. With G > 1 a lane's
        first token of every epoch is context only, like padding: the token before it ended the lane's stretch of
        the previous epoch (or is padding), another place of another document, so it is no target. (G = 1: the
        seam is the stream's own, the last document's end, then the next epoch's first EOS.)"""
        tokens_N = np.full(n, self.stream.eos_id, dtype=np.int32)
        real_N = np.zeros(n, dtype=bool)
        for at, pos, count, first in self._pieces(g, o, n):
            tokens_N[at:at + count] = self.stream.read(pos, count)
            real_N[at + (first and self.lanes > 1):at + count] = True
        return tokens_N, real_N

    def documents(self, g: int, o: int, n: int) -> np.ndarray:
        """Document id of lane g's offsets [o, o + n); -1 for padding."""
        out_N = np.full(n, -1, dtype=np.int64)
        for at, pos, count, _ in self._pieces(g, o, n):
            out_N[at:at + count] = self.stream.documents(pos, count)
        return out_N


def _rows(stream: TokenStream, start: int, seq_len: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs_BxL, targets_BxL) of `rows` rows from stream position `start`; rows overlap by one token."""
    span_N = stream.read(start, rows * seq_len + 1)
    return span_N[:-1].reshape(rows, seq_len), span_N[1:].reshape(rows, seq_len)


class _TrainBatchAt:
    """Batch k of a stage: a pure function of k (pickled into Grain worker processes)."""

    def __init__(self, lanes: Lanes, cursor0: int, seq_len: int, batch_size: int,
                 process_index: int, process_count: int):
        self.lanes, self.cursor0, self.seq_len, self.batch_size = lanes, cursor0, seq_len, batch_size
        local = batch_size // process_count
        self.rows = (process_index * local, (process_index + 1) * local)  # global rows [r0, r1)

    def lane_rows(self) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """(lane g, its first row index i0, its row count m, local row positions) for this process."""
        G, (r0, r1) = self.lanes.lanes, self.rows
        for g in range(G):
            i0, i1 = -(-(r0 - g) // G), (r1 - 1 - g) // G  # rows r = i*G + g inside [r0, r1)
            if i1 >= i0:
                yield g, i0, i1 - i0 + 1, np.arange(i0, i1 + 1) * G + g - r0

    def __call__(self, k: int) -> dict:
        L = self.seq_len
        cursor = self.cursor0 + k * self.batch_size * L
        o = cursor // self.lanes.lanes
        local = self.rows[1] - self.rows[0]
        inputs = np.empty((local, L), np.int32)
        targets = np.empty((local, L), np.int32)
        mask = np.empty((local, L), np.float32)
        for g, i0, m, at in self.lane_rows():
            tokens_N, real_N = self.lanes.read(g, o + i0 * L, m * L + 1)
            inputs[at], targets[at] = tokens_N[:-1].reshape(m, L), tokens_N[1:].reshape(m, L)
            mask[at] = real_N[1:].reshape(m, L)
        return {"inputs": inputs, "targets": targets, "mask": mask, "cursor": np.int64(cursor)}

    def documents(self, k: int) -> np.ndarray:
        """int64[local, L + 1]: the document id of every token of batch k's rows (-1: padding)."""
        L = self.seq_len
        o = (self.cursor0 + k * self.batch_size * L) // self.lanes.lanes
        out = np.empty((self.rows[1] - self.rows[0], L + 1), np.int64)
        for g, i0, m, at in self.lane_rows():
            d_N = self.lanes.documents(g, o + i0 * L, m * L + 1)
            out[at] = np.lib.stride_tricks.sliding_window_view(d_N, L + 1)[::L]
        return out


def _allow_grain_workers() -> None:
    # grain 0.2.18's mp_prefetch reads an absl flag; outside absl.app nobody has parsed flags.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class BatchStream:
    """What every training stream shares: batch k of a stage from `batch_fn(seq_len, batch_size)` through a Grain
    iterator (thread prefetch, worker processes with num_workers > 0), restarted at a shape change or a restore.

    A subclass says where it stands (`position`: an int every batch carries as "cursor", checked on arrival) and
    how a delivered batch moves it (`_advance`)."""

    def __init__(self, *, process_index: int, process_count: int, num_workers: int, prefetch: int):
        if not 0 <= process_index < process_count:
            raise UserError(f"process_index {process_index} is not in [0, {process_count})")
        if num_workers < 0 or prefetch < 0:
            raise UserError(f"data.num_workers ({num_workers}) and data.prefetch ({prefetch}) must be >= 0")
        self.process_index, self.process_count = process_index, process_count
        self.num_workers, self.prefetch = num_workers, prefetch
        self._iter = None
        self._shape: tuple[int, int] | None = None

    def batch_fn(self, seq_len: int, batch_size: int):
        raise NotImplementedError

    @property
    def position(self) -> int:
        raise NotImplementedError

    def _advance(self, seq_len: int, batch_size: int, advance: dict | None = None) -> None:
        """Move past one delivered batch; `advance`: what its batch function said about that (its "advance"
        entry), when it says anything."""
        raise NotImplementedError

    @staticmethod
    def _check_resume(state: dict, seed: int, saved_lanes: int, lanes: int) -> None:
        """The checks every stream's `set_state` makes: the same shuffle seed and the same number of lanes."""
        if state.get("seed") != seed:
            raise UserError(f"saved data-stream state used data.shuffle_seed={state.get('seed')} but this run "
                            f"uses {seed}; set data.shuffle_seed={state.get('seed')} to resume exactly")
        if saved_lanes != lanes:
            raise UserError(f"saved data-stream state read {saved_lanes} lanes but this run reads "
                            f"{lanes}; set data.lanes={saved_lanes} to resume exactly")

    def _restart(self, seq_len: int, batch_size: int) -> None:
        self.close()
        fn = self.batch_fn(seq_len, batch_size)
        threads = 1 if self.prefetch else 0
        it_ds = grain.MapDataset.range(0, 2**62).map(fn).to_iter_dataset(
            grain.ReadOptions(num_threads=threads, prefetch_buffer_size=self.prefetch))
        if self.num_workers > 0:
            _allow_grain_workers()
            it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(
                num_workers=self.num_workers, per_worker_buffer_size=max(self.prefetch, 1)))
        self._iter = iter(it_ds)
        self._shape = (seq_len, batch_size)

    def next_batch(self, seq_len: int, batch_size: int) -> dict:
        """Next global batch's local rows: inputs / targets int32[B_local, L], mask float32[B_local, L].

        B_local = batch_size // process_count; mask is 0 on lane padding and at each lane's epoch seam (module
        docstring). A new (seq_len, batch_size) continues the stream.
        """
        if self._shape != (seq_len, batch_size) or self._iter is None:
            self._restart(seq_len, batch_size)
        batch = next(self._iter)
        if int(batch.pop("cursor")) != self.position:  # Grain returned batches out of order: a bug
            raise RuntimeError(f"data stream out of step: expected cursor {self.position}")
        self._advance(seq_len, batch_size, batch.pop("advance", None))
        return batch

    def close(self) -> None:
        """Stop prefetch threads / worker processes (a later next_batch restarts them)."""
        if self._iter is not None:
            close = getattr(self._iter, "close", None)
            if close is not None:
                close()
            self._iter = None
            self._shape = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class TrainStream(BatchStream):
    """Infinite packed training batches; `next_batch(seq_len, batch_size)` may change shape at any call."""

    def __init__(self, ds: PreparedDataset, *, seed: int, lanes: int = 1, process_index: int = 0,
                 process_count: int = 1, num_workers: int = 0, prefetch: int = 2):
        super().__init__(process_index=process_index, process_count=process_count, num_workers=num_workers,
                         prefetch=prefetch)
        self.ds, self.seed = ds, int(seed)
        self.stream = TokenStream(ds.split("train"), ds.eos_id, self.seed)
        self.lanes = Lanes(self.stream, lanes)
        self.cursor = 0

    def batch_fn(self, seq_len: int, batch_size: int) -> _TrainBatchAt:
        """Batch k (k = 0, 1, ...) of shape (seq_len, batch_size) from the current cursor, as a function."""
        if seq_len < 1 or batch_size < 1 or batch_size % self.process_count or batch_size % self.lanes.lanes:
            raise UserError(f"batch_size {batch_size} must be a positive multiple of the process count "
                            f"{self.process_count} and of data.lanes ({self.lanes.lanes}), and seq_len "
                            f"{seq_len} positive")
        return _TrainBatchAt(self.lanes, self.cursor, seq_len, batch_size, self.process_index, self.process_count)

    @property
    def position(self) -> int:
        return self.cursor

    def _advance(self, seq_len: int, batch_size: int, advance: dict | None = None) -> None:
        self.cursor += seq_len * batch_size

    @property
    def tokens_consumed(self) -> int:
        """Target tokens delivered so far, over all processes (equals the cursor)."""
        return self.cursor

    def get_state(self) -> dict:
        """JSON-serializable exact position (the same on every process)."""
        return {"kind": _STATE_KIND, "version": 1, "cursor": self.cursor, "tokens_consumed": self.cursor,
                "epoch": self.cursor // self.lanes.epoch_len, "seed": self.seed, "lanes": self.lanes.lanes,
                "dataset": self.ds.fingerprint("train")}

    def set_state(self, state: dict) -> None:
        """Continue from a `get_state()` result; UserError if it belongs to another seed or dataset."""
        if isinstance(state, dict) and state.get("kind") == MIXTURE_STATE_KIND:
            raise UserError(f"saved data-stream state is of a mixture ({', '.join(state.get('domains', {}))}) but "
                            "data.train is one dataset now; resume with the same data.train")
        if not isinstance(state, dict) or state.get("kind") != _STATE_KIND or not isinstance(state.get("cursor"), int):
            raise UserError("saved data-stream state is not a yxanul train stream state; "
                            "restore it from the same run's checkpoint")
        self._check_resume(state, self.seed, state.get("lanes", 1), self.lanes.lanes)
        if not same_dataset(state.get("dataset"), self.ds.fingerprint("train")):
            raise UserError(f"saved data-stream state belongs to another dataset than '{self.ds.path}' (its "
                            "documents, their order or the tokenizer differ); resume with the same data.train")
        self.close()
        self.cursor = int(state["cursor"])


# --------------------------------------------------------------------------------------------
# Validation


class _EvalBatchAt:
    def __init__(self, stream: TokenStream, seq_len: int, batch_size: int, process_index: int, process_count: int):
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.local = batch_size // process_count
        self.offset = process_index * self.local * seq_len

    def __call__(self, k: int) -> dict:
        start = k * self.batch_size * self.seq_len + self.offset
        inputs, targets = _rows(self.stream, start, self.seq_len, self.local)
        # target (r, j) is stream position start + r*L + j + 1; real while < stream length
        pos_BxL = start + 1 + np.arange(self.local * self.seq_len).reshape(self.local, self.seq_len)
        return {"inputs": inputs, "targets": targets, "mask": (pos_BxL < self.stream.length).astype(np.float32)}


EVAL_ORDER_SEED = 0
"""The fixed document order of every validation pass (`eval_batches`): the same for every run, seed and step."""


def eval_batches(ds_or_path: PreparedDataset | str, *, seq_len: int, batch_size: int, split: str = "val",
                 max_batches: int = 0, process_index: int = 0, process_count: int = 1) -> Iterator[dict]:
    """One deterministic pass over a split, packed like training (EOS d EOS d ...), its documents in one fixed
    shuffled order (EVAL_ORDER_SEED): a pass cut short by `max_batches` is a random sample of the split's
    documents, not the first input files' (a corpus prepared from its sources one after another).

    Yields {"inputs", "targets": int32[B_local, L], "mask": float32[B_local, L]}; the last batch is
    padded (EOS tokens, mask 0). Every process yields the same number of batches:
    ceil((tokens + documents - 1) / (B*L)), at most `max_batches` when > 0.
    """
    ds = ds_or_path if isinstance(ds_or_path, PreparedDataset) else open_dataset(ds_or_path)
    if seq_len < 1 or batch_size < 1 or batch_size % process_count:
        raise UserError(f"eval batch_size {batch_size} must be a positive multiple of the process count "
                        f"{process_count} and seq_len {seq_len} positive")
    stream = TokenStream(ds.split(split), ds.eos_id, seed=EVAL_ORDER_SEED, finite=True)
    n = math.ceil((stream.length - 1) / (batch_size * seq_len))
    if max_batches > 0:
        n = min(n, max_batches)
    fn = _EvalBatchAt(stream, seq_len, batch_size, process_index, process_count)
    it_ds = grain.MapDataset.range(n).map(fn).to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
    yield from it_ds
