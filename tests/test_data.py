"""Tests of yxanul_jax/data/loader.py and dataset.py: packing, determinism, exact resume, stage changes, sharding, eval."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from data_fixtures import docs, prepared, tiny_tok  # noqa: F401  (fixtures)
from yxanul_jax.core.errors import UserError
from yxanul_jax.data.corpus import stdlib_files
from yxanul_jax.data.dataset import open_dataset
from yxanul_jax.data.layout import MANIFEST, TOKENS_GLOB
from yxanul_jax.data.loader import EVAL_ORDER_SEED, TrainStream, eval_batches
from yxanul_jax.data.prepare import prepare_documents


def split_docs(ds, split):
    idx = ds.split(split)
    return [np.asarray(idx.doc_slice(d, 0, int(idx.lengths[d])), dtype=np.int32) for d in range(idx.num_documents)]


def packed(docs_in_order, eos):
    return np.concatenate([np.concatenate([[eos], d]) for d in docs_in_order]).astype(np.int32)


def flat_targets(stream, shapes):
    return np.concatenate([stream.next_batch(L, B)["targets"].ravel() for L, B in shapes])


def test_rows_have_shape_dtype_and_shifted_targets(prepared):
    ds = open_dataset(prepared)
    s = TrainStream(ds, seed=0)
    b = s.next_batch(16, 4)
    assert set(b) == {"inputs", "targets", "mask"}
    assert b["inputs"].shape == b["targets"].shape == b["mask"].shape == (4, 16)
    assert b["inputs"].dtype == b["targets"].dtype == np.int32 and b["mask"].dtype == np.float32
    assert (b["mask"] == 1).all()
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])  # targets = inputs shifted
    np.testing.assert_array_equal(b["inputs"][1:, 0], b["targets"][:-1, -1])  # rows overlap by one token
    assert b["inputs"][0, 0] == ds.eos_id  # the stream starts with the first document's EOS
    assert 0 <= b["inputs"].min() and b["inputs"].max() < ds.vocab_size


def test_epoch_has_every_token_exactly_once_with_eos_between_documents(prepared):
    ds = open_dataset(prepared)
    s = TrainStream(ds, seed=3)
    length = s.stream.length
    chunks = []
    while s.cursor < length:
        chunks.append(s.next_batch(16, 4)["targets"].ravel())
    stream0 = np.concatenate([[ds.eos_id], np.concatenate(chunks)[:length - 1]])  # positions 0..T-1
    docs = split_docs(ds, "train")
    assert all(ds.eos_id not in d for d in docs)
    # EOS separates documents: cutting at EOS gives back exactly the split's documents, each once
    cuts = np.flatnonzero(stream0 == ds.eos_id)
    pieces = [tuple(stream0[a + 1:b]) for a, b in zip(cuts, list(cuts[1:]) + [length])]
    assert sorted(pieces) == sorted(tuple(d) for d in docs)
    order = s.stream.epoch_order(0)
    assert sorted(order) == list(range(len(docs))) and list(order) != sorted(order)  # shuffled
    np.testing.assert_array_equal(stream0, packed([docs[i] for i in order], ds.eos_id))
    assert s.get_state()["epoch"] == 1 and s.get_state()["tokens_consumed"] == s.cursor


def test_next_epoch_is_reshuffled_and_complete(prepared):
    ds = open_dataset(prepared)
    s = TrainStream(ds, seed=3)
    T = s.stream.length
    s.set_state({**s.get_state(), "cursor": T - 1})  # the next target is position T, epoch 1's first
    flat = flat_targets(s, [(64, 4)] * (T // 256 + 2))
    epoch1 = flat[:T]  # positions T .. 2T-1
    docs = split_docs(ds, "train")
    order1 = s.stream.epoch_order(1)
    assert list(order1) != list(s.stream.epoch_order(0))
    np.testing.assert_array_equal(epoch1, packed([docs[i] for i in order1], ds.eos_id))


def test_same_seed_same_batches_other_seed_other_batches(prepared):
    ds = open_dataset(prepared)
    shapes = [(32, 4)] * 5
    a = flat_targets(TrainStream(ds, seed=7), shapes)
    b = flat_targets(TrainStream(open_dataset(prepared), seed=7), shapes)
    c = flat_targets(TrainStream(ds, seed=8), shapes)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_restore_mid_epoch_gives_identical_next_batches_also_from_workers(prepared):
    ds = open_dataset(prepared)
    with TrainStream(ds, seed=1, num_workers=2, prefetch=2) as s:
        for _ in range(5):
            s.next_batch(16, 4)
        state = json.loads(json.dumps(s.get_state()))
        expected = [s.next_batch(16, 4) for _ in range(3)] + [s.next_batch(24, 2)]
    assert 0 < state["cursor"] < s.stream.length  # mid-epoch
    r = TrainStream(open_dataset(prepared), seed=1)  # in-process reader, fresh object
    r.set_state(state)
    got = [r.next_batch(16, 4) for _ in range(3)] + [r.next_batch(24, 2)]
    for e, g in zip(expected, got):
        for key in ("inputs", "targets", "mask"):
            np.testing.assert_array_equal(e[key], g[key])


def test_stage_change_continues_the_same_token_stream(prepared):
    ds = open_dataset(prepared)
    shapes = [(16, 4)] * 3 + [(32, 2)] * 2 + [(8, 3)] * 4 + [(64, 1)] * 2
    staged = TrainStream(ds, seed=5)
    mixed = flat_targets(staged, shapes)
    assert staged.cursor == sum(L * B for L, B in shapes) == len(mixed)
    plain = flat_targets(TrainStream(ds, seed=5), [(8, 1)] * (len(mixed) // 8 + 1))
    np.testing.assert_array_equal(mixed, plain[:len(mixed)])  # no token skipped or repeated
    # and a state saved right after a stage change resumes there
    again = TrainStream(ds, seed=5)
    flat_targets(again, shapes[:4])
    state = again.get_state()
    tail = flat_targets(again, shapes[4:])
    resumed = TrainStream(ds, seed=5)
    resumed.set_state(state)
    np.testing.assert_array_equal(flat_targets(resumed, shapes[4:]), tail)


def test_processes_get_disjoint_row_shards_of_the_global_batch(prepared):
    ds = open_dataset(prepared)
    whole = TrainStream(ds, seed=2)
    parts = [TrainStream(ds, seed=2, process_index=p, process_count=2) for p in range(2)]
    for L, B in [(16, 4), (16, 4), (8, 6)]:
        full = whole.next_batch(L, B)
        local = [p.next_batch(L, B) for p in parts]
        assert local[0]["inputs"].shape == (B // 2, L)
        for key in ("inputs", "targets"):
            np.testing.assert_array_equal(np.concatenate([x[key] for x in local]), full[key])
    assert parts[0].get_state() == parts[1].get_state() == whole.get_state()
    with pytest.raises(UserError, match="multiple of the process count"):
        parts[0].next_batch(16, 3)


def test_eval_is_one_deterministic_masked_pass(prepared):
    ds = open_dataset(prepared)
    docs = split_docs(ds, "val")
    order = np.random.default_rng([EVAL_ORDER_SEED, 0]).permutation(len(docs))  # one fixed shuffle of the split
    assert not (order == np.arange(len(docs))).all()  # so a capped pass samples the split, not its first files
    stream = packed([docs[i] for i in order], ds.eos_id)
    batches = list(eval_batches(ds, seq_len=16, batch_size=4))
    assert len(batches) == -(-(len(stream) - 1) // 64)
    assert all(b["inputs"].shape == b["mask"].shape == (4, 16) for b in batches)
    mask = np.concatenate([b["mask"].ravel() for b in batches])
    targets = np.concatenate([b["targets"].ravel() for b in batches])
    assert mask.sum() == len(stream) - 1 and mask[-1] == 0  # the last batch is padded
    np.testing.assert_array_equal(targets[mask == 1], stream[1:])
    again = list(eval_batches(str(prepared), seq_len=16, batch_size=4))
    np.testing.assert_array_equal(np.concatenate([b["targets"] for b in again]).ravel(), targets)
    assert len(list(eval_batches(ds, seq_len=16, batch_size=4, max_batches=2))) == 2
    halves = [list(eval_batches(ds, seq_len=16, batch_size=4, process_index=p, process_count=2)) for p in range(2)]
    assert len(halves[0]) == len(halves[1]) == len(batches)
    np.testing.assert_array_equal(np.concatenate([halves[0][-1]["mask"], halves[1][-1]["mask"]]), batches[-1]["mask"])


def test_the_reference_losses_score_the_targets_validation_reads(prepared):
    from conftest import load_script

    ds = open_dataset(prepared)
    batches = list(eval_batches(ds, seq_len=16, batch_size=4, max_batches=2))
    read = np.concatenate([b["targets"][b["mask"] == 1] for b in batches])
    val = load_script("reference_losses").packed(ds, "val")
    np.testing.assert_array_equal(val[1:len(read) + 1], read)  # `--max-targets N`: the first N a capped pass reads


def test_shards_are_memory_mapped_not_loaded(prepared):
    ds = open_dataset(prepared)
    piece = ds.split("train").doc_slice(0, 0, 4)
    assert isinstance(piece, np.memmap)


def test_dataset_errors_are_one_line_user_errors(prepared, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        open_dataset(tmp_path / "nope")
    with pytest.raises(UserError, match="no manifest.json"):
        open_dataset(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(prepared, bad)
    (bad / MANIFEST).write_text("{not json")
    with pytest.raises(UserError, match="corrupt"):
        open_dataset(bad)
    broken = tmp_path / "broken"
    shutil.copytree(prepared, broken)
    next((broken / "train").glob(TOKENS_GLOB)).unlink()
    with pytest.raises(UserError, match="incomplete"):
        TrainStream(open_dataset(broken), seed=0)
    cut = tmp_path / "cut"  # a shard cut short (a full disk, an interrupted copy): found at open, in one line
    shutil.copytree(prepared, cut)
    shard = next((cut / "train").glob(TOKENS_GLOB))
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    with pytest.raises(UserError, match="tokens.npy' or its offsets cannot be read .*damaged"):
        TrainStream(open_dataset(cut), seed=0)


def test_vocab_mismatch_names_both_numbers_and_the_fix(prepared):
    ds = open_dataset(prepared)
    ds.check_vocab(ds.vocab_size)
    with pytest.raises(UserError) as e:
        ds.check_vocab(4096)
    msg = str(e.value)
    assert str(ds.vocab_size) in msg and "4096" in msg and f"model.vocab_size={ds.vocab_size}" in msg
    assert "\n" not in msg
    # under init.from_hf the model's vocabulary is the checkpoint's: no config key can fix it, the data must
    with pytest.raises(UserError) as e:
        ds.check_vocab(4096, "init.from_hf", "hf/llama")
    msg = str(e.value)
    assert "init.from_hf ('hf/llama') has 4096 entries" in msg and "model.vocab_size=" not in msg
    assert "that model's tokenizer" in msg and "\n" not in msg
    # and under init.from_checkpoint (model.vocab_size=N would be replaced by the checkpoint's again)
    with pytest.raises(UserError) as e:
        ds.check_vocab(4096, "init.from_checkpoint", "runs/a/checkpoints")
    msg = str(e.value)
    assert "init.from_checkpoint ('runs/a/checkpoints') has 4096 entries" in msg and "model.vocab_size=" not in msg
    assert "the tokenizer its run trained with" in msg


def test_restore_refuses_other_seed_or_dataset(prepared, tmp_path, docs, tiny_tok):
    ds = open_dataset(prepared)
    state = TrainStream(ds, seed=1).get_state()
    with pytest.raises(UserError, match="shuffle_seed=1"):
        TrainStream(ds, seed=2).set_state(state)
    other = tmp_path / "other"
    prepare_documents([docs[:40]], tiny_tok, other, request={"t": 1}, val_fraction=0.0, progress=False)
    with pytest.raises(UserError, match="another dataset"):
        TrainStream(open_dataset(other), seed=1).set_state(state)
    # the same documents prepared in another order: equal counts and tokenizer, and still refused (the stored
    # position would point at other documents)
    for name, order in (("all", docs), ("reordered", docs[::-1])):
        prepare_documents([order], tiny_tok, tmp_path / name, request={"t": name}, val_fraction=0.0, progress=False)
    ds_all, ds_rev = open_dataset(tmp_path / "all"), open_dataset(tmp_path / "reordered")
    saved = TrainStream(ds_all, seed=1).get_state()
    assert {k: v for k, v in saved["dataset"].items() if k != "order"} == \
        {k: v for k, v in ds_rev.fingerprint().items() if k != "order"}
    with pytest.raises(UserError, match="another dataset .* their order"):
        TrainStream(ds_rev, seed=1).set_state(saved)
    # a position saved before the order was recorded still resumes on its dataset
    TrainStream(ds_all, seed=1).set_state({**saved, "dataset": {k: v for k, v in saved["dataset"].items()
                                                                if k != "order"}})
    with pytest.raises(UserError, match="no 'val' documents"):
        next(eval_batches(other, seq_len=8, batch_size=2))
    only_val = tmp_path / "only_val"
    prepare_documents([docs[:40]], tiny_tok, only_val, request={"t": 2}, val_fraction=1.0, progress=False)
    with pytest.raises(UserError, match="no 'train' documents"):
        TrainStream(open_dataset(only_val), seed=0)


# --------------------------------------------------------------------------------------------
# Lanes: rows of one batch from far-apart places of the shuffled epoch


def lane_targets(batches, lanes):
    """Per lane, its targets (and mask) in stream order: lane g owns rows g, g + G, g + 2G, ..."""
    t = [np.concatenate([b["targets"][g::lanes].ravel() for b in batches]) for g in range(lanes)]
    m = [np.concatenate([b["mask"][g::lanes].ravel() for b in batches]) for g in range(lanes)]
    return t, m


def test_lanes_cover_the_epoch_once_with_padding_masked(prepared):
    ds = open_dataset(prepared)
    G = 4
    s = TrainStream(ds, seed=3, lanes=G)
    T, lane = s.stream.length, s.lanes.lane_len
    assert lane == -(-T // G) and s.lanes.epoch_len == G * lane
    batches = []
    while s.cursor < s.lanes.epoch_len:
        batches.append(s.next_batch(16, 8))
    expected = packed([split_docs(ds, "train")[i] for i in s.stream.epoch_order(0)], ds.eos_id)
    assert len(expected) == T
    targets, masks = lane_targets(batches, G)
    real_total = 0
    for g in range(G):
        want = expected[g * lane + 1:(g + 1) * lane]  # lane g's epoch-0 targets (its first token is context)
        n = len(want)
        np.testing.assert_array_equal(targets[g][:n], want)
        assert masks[g][:n].all() and not masks[g][n:lane - 1].any()  # the last lane's tail is padding
        real_total += n + 1
    assert real_total == T  # lanes tile the epoch: every token once
    assert s.get_state()["epoch"] == 1 and s.get_state()["lanes"] == G


def test_no_target_crosses_a_lanes_epoch_seam(prepared):
    ds = open_dataset(prepared)
    for G in (1, 4):
        lanes = TrainStream(ds, seed=3, lanes=G).lanes
        n = lanes.lane_len + 40  # every lane read from its start across its seam into epoch 1
        for g in range(G):
            tokens_N, target_N = lanes.read(g, 0, n)
            docs_N = lanes.documents(g, 0, n)
            # a target of another document than its input's opens that document (its EOS), else it is no target
            crossing = (docs_N[1:] != docs_N[:-1]) & target_N[1:]
            assert (tokens_N[1:][crossing] == ds.eos_id).all(), (G, g)
            seam = lanes.lane_len  # lane g's first token of epoch 1
            if G > 1:
                assert not target_N[seam] and target_N[seam + 1:].all()
            else:  # the plain stream's seam is a document boundary: epoch 1 opens with an EOS target
                assert tokens_N[seam] == ds.eos_id and target_N[1:].all()


def test_lanes_stage_change_resume_and_process_shards(prepared):
    ds = open_dataset(prepared)
    G = 4
    shapes = [(16, 8)] * 3 + [(32, 4)] * 2 + [(8, 12)] * 4
    staged = TrainStream(ds, seed=5, lanes=G)
    mixed = [staged.next_batch(L, B) for L, B in shapes]
    plain = TrainStream(ds, seed=5, lanes=G)
    reference = [plain.next_batch(8, G) for _ in range(staged.cursor // (8 * G))]
    for a, b in zip(lane_targets(mixed, G)[0], lane_targets(reference, G)[0]):
        np.testing.assert_array_equal(a, b)  # per lane: no token skipped or repeated by a shape change
    first = TrainStream(ds, seed=5, lanes=G)
    for L, B in shapes[:4]:
        first.next_batch(L, B)
    resumed = TrainStream(ds, seed=5, lanes=G)
    resumed.set_state(json.loads(json.dumps(first.get_state())))  # right after a shape change
    for (L, B), want in zip(shapes[4:], mixed[4:]):
        np.testing.assert_array_equal(resumed.next_batch(L, B)["inputs"], want["inputs"])
    for P, B in [(2, 8), (2, 4), (4, 8)]:  # rows per process a multiple of G, or a part of one lane round
        whole = TrainStream(ds, seed=2, lanes=G).next_batch(16, B)
        parts = [TrainStream(ds, seed=2, lanes=G, process_index=p, process_count=P).next_batch(16, B)
                 for p in range(P)]
        for key in ("inputs", "targets", "mask"):
            np.testing.assert_array_equal(np.concatenate([x[key] for x in parts]), whole[key])
    with pytest.raises(UserError, match="data.lanes"):
        staged.next_batch(16, 6)
    with pytest.raises(UserError, match="data.lanes=4"):
        TrainStream(ds, seed=5, lanes=2).set_state(staged.get_state())


@pytest.fixture(scope="module")
def long_documents(tmp_path_factory, tiny_tok):
    """Whole stdlib files (thousands of tokens each): one document spans many batch rows."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files(400_000)]
    out = tmp_path_factory.mktemp("long") / "ds"
    prepare_documents([texts], tiny_tok, out, request={"fixture": "long"}, val_fraction=0.0, progress=False)
    return open_dataset(out)


def test_a_batch_of_16_rows_mixes_documents(long_documents):
    ds = long_documents
    assert np.median(ds.split("train").lengths) > 16 * 128  # a single document outlasts a whole batch
    for seed in range(3):
        one_lane = TrainStream(ds, seed=seed, lanes=1).batch_fn(128, 16)
        lanes = TrainStream(ds, seed=seed, lanes=16).batch_fn(128, 16)
        for k in (0, 7, 50):
            first_docs = lanes.documents(k)[:, 1]  # the document of each row's first target
            assert len(set(first_docs.tolist())) >= 8, first_docs  # at least half the rows differ
            assert len(set(one_lane.documents(k)[:, 1].tolist())) <= 3  # the plain stream: one or two books
            np.testing.assert_array_equal(lanes(k)["inputs"].shape, (16, 128))
