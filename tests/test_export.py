"""Export to Hugging Face: the real `transformers` loads what we write, its logits equal our float32
forward, its greedy generation equals ours, it samples as our `generate` does when told nothing, and
importing the export gives the same model back."""
import dataclasses
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from yxanul_jax.core.config import FP8Config
from yxanul_jax.export import export
from yxanul_jax.export import main as export_main
from yxanul_jax.inference import sampling
from yxanul_jax.inference.sampling import generate
from yxanul_jax.inference.trained import Trained, load_trained
from yxanul_jax.model import hf
from yxanul_jax.model.transformer import Yxanul, init_variables

from conftest import micro_model
from data_fixtures import run_cli

torch = pytest.importorskip("torch", reason="the parity tests need torch (CPU build) and transformers: the dev extra")
transformers = pytest.importorskip("transformers")

TEXT = Path(__file__).read_text()[:1500]  # real text: Python source, like the demo corpus
OFF = FP8Config(enabled=False)
TOL = 1e-4  # relative to the largest |logit|: float32 on both sides, different summation orders


def _ours_f32(trained: Trained, ids):
    m = dataclasses.replace(trained.cfg.model, dtype="float32")
    return np.asarray(Yxanul(m, OFF).apply({"params": trained.params}, jnp.asarray([ids], jnp.int32))[0])


def _theirs(folder, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return model, model(torch.tensor([ids])).logits[0].numpy()


def test_exported_trained_model_matches_in_transformers(trained_run, tmp_path):
    trained = load_trained(run_dir=str(trained_run))
    out = tmp_path / "exports" / "hf"  # its folder is made: `export --output hf/tiny` on a fresh checkout
    summary = export(trained, str(out), "float32")
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]
    modes = {name: (out / name).stat().st_mode & 0o777 for name in os.listdir(out)}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the rest (umask), not owner-only
    assert summary["tie_word_embeddings"] and summary["vocab_size"] == 512
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok(TEXT)["input_ids"][:96]
    assert ids == trained.tokenizer().tokenizer.encode(TEXT).ids[:96]  # the same tokenizer, through transformers
    model, theirs = _theirs(out, ids)
    ours = _ours_f32(trained, ids)
    assert model.config.vocab_size == 512 and theirs.shape == ours.shape == (96, 512)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=TOL * np.abs(ours).max())
    # 20 greedy tokens: transformers.generate == ours (no EOS stop on either side within 20)
    prompt = ids[:24]
    want = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    m = dataclasses.replace(trained.cfg.model, dtype="float32")
    got = generate(m, OFF, {"params": trained.params}, [prompt], 20)["tokens"][0]
    assert got == want
    # told nothing, transformers samples as our `generate` does by default (greedy loops a small model on one token);
    # the length stays the caller's (or transformers' own default)
    gen = transformers.GenerationConfig.from_pretrained(out)
    assert gen.do_sample and (gen.temperature, gen.top_k, gen.top_p) == (sampling.TEMPERATURE, sampling.TOP_K,
                                                                         sampling.TOP_P)
    assert gen.eos_token_id == gen.pad_token_id == trained.tokenizer().eos_id and gen.max_new_tokens is None
    drawn = []
    for seed in (0, 1):  # lm-eval's way: a max_length, which a max_new_tokens in the file would override
        torch.manual_seed(seed)
        drawn.append(model.generate(torch.tensor([prompt]), max_length=len(prompt) + 90)[0, len(prompt):].tolist())
    assert drawn[0] != drawn[1] and all(0 < len(d) <= 90 for d in drawn)  # sampled, within the caller's length
    assert 90 in map(len, drawn) or trained.tokenizer().eos_id in drawn[0] + drawn[1]


@pytest.mark.parametrize("overrides", [dict(head="factorized"), dict(head="untied", embed_rank=0),
                                       dict(head="untied", scan_layers=True, remat="full"),
                                       dict(fuse_projections=True, scan_layers=True)],
                         ids=["factorized-head", "untied-full", "untied-scanned", "fused-qkv"])
def test_every_head_maps_to_llama(overrides, tmp_path):
    m = micro_model(**overrides)
    params = jax.device_get(init_variables(m, OFF, jax.random.key(3))["params"])
    tied, tensors = hf.to_hf(m, params)
    cfg = transformers.LlamaConfig(**{k: v for k, v in hf.hf_config(m, tied, None, "float32").items()
                                      if k not in ("architectures", "model_type", "dtype", "torch_dtype")})
    model = transformers.LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} and (tied or not missing)
    if tied:
        model.tie_weights()
    ids = list(range(1, 40))
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(Yxanul(m, OFF).apply({"params": params}, jnp.asarray([ids], jnp.int32))[0])
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=TOL * np.abs(ours).max())


def test_import_of_an_export_gives_the_same_logits():
    m = micro_model(embed_rank=0, head="untied")  # init.from_hf starts full-embedding models
    params = jax.device_get(init_variables(m, OFF, jax.random.key(4))["params"])
    tied, tensors = hf.to_hf(m, params)
    config = hf.hf_config(m, tied, None, "float32")
    m2 = hf.model_config_from_hf(config, micro_model(name="imported", n_layers=1, d_model=16))
    assert (m2.d_model, m2.n_layers, m2.embed_rank, m2.head, m2.padded_vocab) == (32, 2, 0, "untied", 112)
    assert m2.head_dim == m.head_dim == 0  # d_model // n_heads stays the automatic 0, not a literal that differs
    wide = hf.model_config_from_hf({**config, "head_dim": 32}, m2)  # a head width of its own is kept
    assert wide.head_dim == 32 and wide.resolved_head_dim == 32
    like = init_variables(m2, OFF, jax.random.key(0))["params"]
    back = hf.from_hf(m2, tensors, like)
    ids = jnp.arange(1, 30)[None, :]
    np.testing.assert_array_equal(np.asarray(Yxanul(m2, OFF).apply({"params": back}, ids)),
                                  np.asarray(Yxanul(m, OFF).apply({"params": params}, ids)))


def test_import_refuses_what_is_not_a_llama():
    base = micro_model()
    with pytest.raises(Exception, match="not a Llama"):
        hf.model_config_from_hf({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, base)
    with pytest.raises(Exception, match="hidden_act"):
        hf.model_config_from_hf({"model_type": "llama", "hidden_act": "gelu"}, base)
    with pytest.raises(Exception, match="scaled RoPE"):
        hf.model_config_from_hf({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}}, base)


def test_export_cli_refuses_an_existing_output_and_bad_sources(trained_run, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("keep me")
    for args, needle in ((["--run-dir", str(trained_run), "--output", str(taken)], "already exists"),
                         (["--run-dir", str(tmp_path), "--output", str(tmp_path / "new")], "not a run directory"),
                         (["--output", str(tmp_path / "new")], "exactly one of")):
        rc, _, err = run_cli(export_main, args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and needle in lines[0], err
    assert (taken / "x").read_text() == "keep me" and not (tmp_path / "new").exists()


def test_export_cli_refuses_an_empty_or_unwritable_output_before_the_restore(tmp_path):
    """Checked before anything is read: the --run-dir here is no run at all, so a later check would say so."""
    for output, needle in (("", "--output is empty (an unset shell variable?)"),
                           ("/proc/yxanul-export", "'/proc/yxanul-export'")):
        rc, _, err = run_cli(export_main, ["--run-dir", str(tmp_path), "--output", output])
        assert rc == 2 and err.count("\n") == 1 and needle in err and ".tmp-" not in err, err
    assert not [p for p in os.listdir("/proc") if p.startswith(".yxanul")]


def test_no_output_goes_inside_a_runs_checkpoint_folder(trained_run, tmp_path):
    """An export into a step's folder was deleted with the step when training rotated it, and one named like a step
    was moved aside as a corrupt checkpoint: every output inside a run's checkpoints/ is refused before the restore
    (a folder of the run beside it is fine)."""
    import shutil

    from yxanul_jax import evaluate, prepare

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns(".lock"))
    before = sorted(os.listdir(run / "checkpoints"))
    step = run / "checkpoints" / before[-1]
    for main, args in ((export_main, ["--run-dir", str(run), "--output", str(step / "hf")]),
                       (export_main, ["--run-dir", str(run), "--output", str(run / "checkpoints" / "30")]),
                       (evaluate.main, ["--run-dir", str(run), "--heldout", str(run / "config.yaml"),
                                        "--output", str(step / "e.json")]),
                       (prepare.main, ["--input", str(run / "config.yaml"), "--tokenizer", str(run / "tokenizer.json"),
                                       "--output", str(run / "checkpoints" / "p")])):
        rc, _, err = run_cli(main, args)
        assert rc == 2 and err.count("\n") == 1 and f"inside the checkpoint folder '{run / 'checkpoints'}'" in err \
            and f"e.g. '{run / Path(args[-1]).name}'" in err, err
    assert sorted(os.listdir(run / "checkpoints")) == before and sorted(os.listdir(step)) == sorted(
        os.listdir(trained_run / "checkpoints" / before[-1]))
    os.symlink(step, tmp_path / "link")  # through a link or `..`: where the write would land
    for output in (tmp_path / "link" / "hf", run / "checkpoints" / "x" / ".." / "hf"):
        rc, _, err = run_cli(export_main, ["--run-dir", str(run), "--output", str(output)])
        assert rc == 2 and "inside the checkpoint folder" in err, err
    rc, _, err = run_cli(export_main, ["--run-dir", str(run), "--output", str(run / "checkpoints" / ".." / "hf")])
    assert rc == 0 and (run / "hf" / "config.json").is_file(), err  # beside it: fine


@pytest.mark.slow
def test_a_run_starts_from_an_exported_llama(trained_run, tmp_path, capsys):
    # export -> train(init.from_hf=...) : the run takes the checkpoint's sizes and weights
    from yxanul_jax.core.config import load_config
    from yxanul_jax.training.loop import fit

    from conftest import TRAINED_RUN
    source = load_trained(run_dir=str(trained_run))
    folder = tmp_path / "hf"
    export(source, str(folder), "float32")
    hf_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf_config, "max_position_embeddings": 1024}))  # as most Llamas
    args = TRAINED_RUN + [f"init.from_hf={folder}", "train.steps=1", "optim.lr=1e-12", "optim.muon_lr=1e-12",
                          "optim.weight_decay=0", "model.d_model=8", "model.n_layers=1", "checkpoint.interval=1"]
    run = tmp_path / "run"
    fit(load_config(None, args), str(run))
    said = capsys.readouterr().err  # the sizes the config asked for and did not get are named, not dropped silently
    assert "init.from_hf: the model's sizes are those of" in said and "model.max_position 4096 -> 1024" in said
    assert "model.d_model 8 -> 64" in said and "model.n_layers 1 -> 2" in said and "model.embed_rank 16 -> 0" in said
    # the same command resumes with the sizes its checkpoint saved, the folder gone (it had refused max_position)
    shutil.move(str(folder), str(tmp_path / "moved"))
    assert fit(load_config(None, [*args[:-1], "train.steps=2"]), str(run)).step == 2
    # and so does --checkpoint, continuing that run's whole state in another folder: the checkpoint tells the sizes
    assert fit(load_config(None, [*args[:-1], "train.steps=3"]), str(tmp_path / "copy"),
               checkpoint=str(run / "checkpoints")).step == 3
    shutil.move(str(tmp_path / "moved"), str(folder))
    started = load_trained(run_dir=str(run))
    m = started.cfg.model
    assert (m.d_model, m.n_layers, m.embed_rank, m.head) == (64, 2, 0, "tied")  # sizes from config.json
    ids = list(range(3, 60))
    ours = np.asarray(Yxanul(dataclasses.replace(m, dtype="float32"), OFF).apply(
        {"params": started.params}, jnp.asarray([ids], jnp.int32))[0])
    np.testing.assert_allclose(ours, _ours_f32(source, ids), rtol=0, atol=TOL * np.abs(ours).max())
    with pytest.raises(Exception, match="no config.json"):
        fit(load_config(None, TRAINED_RUN + [f"init.from_hf={tmp_path}"]), str(tmp_path / "run2"))
