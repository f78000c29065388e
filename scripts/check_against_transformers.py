#!/usr/bin/env python3
"""kiln against Hugging Face: its Llama against transformers' LlamaForCausalLM on the same
weights, and its byte-level BPE against the tokenizers library on the same tokenizer.json.

Llama: makes a small Llama with `kiln init --model llama` (grouped-query heads, untied and tied
heads), loads the weights file strictly into transformers.LlamaForCausalLM (the few lines of
docs/FORMAT.md), runs one batch through both (`kiln dump`, f32 and f64), and compares logits,
loss and every parameter's gradient as ||kiln - transformers|| / ||transformers||: f64 to 1e-9,
f32 to 1e-5 for logits and loss and 1e-4 for each gradient (the GPT reference's tolerances,
shared/reference/README.md).

BPE: learns a tokenizer with `kiln train --tokenizer bpe` on a generated corpus of mixed
scripts, whitespace runs, digits and punctuation, exports it (`kiln tokenize --json`), and
checks that tokenizers.Tokenizer.from_file encodes the corpus, and other text, to exactly
kiln's ids (`kiln tokenize --out`) and decodes them back to the text.

Exits 77 (skipped) when torch, transformers, tokenizers or h5py is missing.

    python3 scripts/check_against_transformers.py build/examples/kiln WORKDIR
"""
import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
    import torch
    import tokenizers
    import transformers
except ImportError as e:
    print(f"skipped: {e.name} is not installed (pip install torch transformers tokenizers h5py)")
    sys.exit(77)


def llama_from_kiln_file(path, dtype):
    """The docs/FORMAT.md recipe: config from the root attributes, parameters from the datasets."""
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["architecture"] in (b"llama", "llama"), a["architecture"]
        config = transformers.LlamaConfig(
            vocab_size=int(a["vocab_size"]), hidden_size=int(a["n_embd"]),
            intermediate_size=int(a["ffn_hidden"]), num_hidden_layers=int(a["n_layer"]),
            num_attention_heads=int(a["n_head"]), num_key_value_heads=int(a["n_kv_head"]),
            max_position_embeddings=int(a["block_size"]), rms_norm_eps=float(a["norm_eps"]),
            rope_theta=float(a["rope_theta"]), tie_word_embeddings=bool(a["tie_embeddings"]),
            attention_bias=False, mlp_bias=False, hidden_act="silu")
        state = datasets_by_name(f)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager").to(dtype)
    model.load_state_dict({k: torch.from_numpy(v).to(dtype) for k, v in state.items()}, strict=True)
    return model


def datasets_by_name(group, prefix=""):
    """Every dataset under its dotted name, hard links included (visititems visits an object
    once, so a tied lm_head/weight would be missed), the tokenizer left out."""
    out = {}
    for key in group:
        name = prefix + key
        if name == "tokenizer":
            continue
        item = group[key]
        if isinstance(item, h5py.Group):
            out.update(datasets_by_name(item, name + "."))
        else:
            out[name] = item[()]
    return out


# transformers' Llama computes three things in float32 whatever the model's dtype: the rotary
# tables, RMSNorm's mean square and the attention softmax (each about 1e-7 relative). An f64
# reference must be f64 throughout, so these are replaced by the same formulas kept in f64
# (float32 models are unaffected).
class F64RotaryEmbedding(torch.nn.Module):

    def __init__(self, head_dim, theta):
        super().__init__()
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * self.inv_freq  # (B, T, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def keep_f64_in_rms_norm_and_softmax():
    from transformers.models.llama import modeling_llama

    def rms_norm_forward(self, hidden_states):
        if hidden_states.dtype != torch.float64:
            return original_rms_norm(self, hidden_states)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def softmax(x, dim=None, dtype=None, **kwargs):
        return original_softmax(x, dim=dim, dtype=torch.float64 if x.dtype == torch.float64 else dtype, **kwargs)

    original_rms_norm = modeling_llama.LlamaRMSNorm.forward
    original_softmax = torch.nn.functional.softmax
    modeling_llama.LlamaRMSNorm.forward = rms_norm_forward
    torch.nn.functional.softmax = softmax


def report(label, errors, tol, n_grads, failures):
    """Prints logits, loss and the worst gradient error of `errors` (name -> relative error) and
    adds a failure for each over its limit in `tol` (logits, loss, grad)."""
    worst = max((e, n) for n, e in errors.items() if n not in ("logits", "loss"))
    print(f"{label}: logits {errors['logits']:.2e}, loss {errors['loss']:.2e}, "
          f"worst gradient {worst[0]:.2e} ({worst[1]}), {n_grads} gradients")
    for name, e in errors.items():
        limit = tol.get(name, tol["grad"])
        if not e < limit:
            failures.append(f"{label} {name}: {e:.3e} >= {limit:.0e}")


def first_difference(a, b):
    """The first index where two id lists differ (the shorter length where one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)) /
                 max(np.linalg.norm(np.asarray(b, np.float64)), 1e-30))


def check(kiln, work, tied):
    weights = os.path.join(work, f"llama_{int(tied)}.h5")
    batch = os.path.join(work, "batch.h5")
    subprocess.run([kiln, "init", "--model", "llama", "--layers", "2", "--embd", "32", "--heads", "4",
                    "--kv-heads", "2", "--block", "16", "--vocab-size", "50", "--rope-theta", "500",
                    "--seed", "5", "--out", weights] + (["--tie-embeddings"] if tied else []),
                   check=True, stdout=subprocess.DEVNULL)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 50, size=(3, 17), dtype=np.int32)
    with h5py.File(batch, "w") as f:
        f["x"], f["y"] = ids[:, :16], ids[:, 1:]
    failures = []
    for dtype, tol in (("f64", {"logits": 1e-9, "loss": 1e-9, "grad": 1e-9}),
                       ("f32", {"logits": 1e-5, "loss": 1e-5, "grad": 1e-4})):
        dump = os.path.join(work, f"dump_{int(tied)}_{dtype}.h5")
        subprocess.run([kiln, "dump", "--weights", weights, "--batch", batch, "--out", dump, "--dtype", dtype],
                       check=True, stdout=subprocess.DEVNULL)
        model = llama_from_kiln_file(weights, torch.float64)  # the reference always in f64
        c = model.config
        theta = c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta
        assert float(theta) == 500.0, f"transformers took rope_theta {theta}, not the file's 500"
        model.model.rotary_emb = F64RotaryEmbedding(c.hidden_size // c.num_attention_heads, float(theta))
        x, y = torch.from_numpy(ids[:, :16].astype(np.int64)), torch.from_numpy(ids[:, 1:].astype(np.int64))
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        with h5py.File(dump, "r") as d:
            errors = {"logits": rel(d["logits"][()], logits.detach().numpy()),
                      "loss": rel(d["loss"][()], loss.detach().numpy())}
            grads = datasets_by_name(d["grads"])
        named = dict(model.named_parameters())
        missing = set(named) - set(grads) - ({"lm_head.weight"} if tied else set())
        if missing:
            failures.append(f"{dtype}: no gradient from kiln for {sorted(missing)}")
        for name, g in grads.items():
            errors[name] = rel(g, named[name].grad.numpy())
        report(f"tied={tied} {dtype}", errors, tol, len(grads), failures)
    return failures


def generated_text(seed, words):
    rng = np.random.default_rng(seed)
    pieces = ["the", "quick", "Brown", "fox", "naïve", "café", "日本語", "Ünïcödé", "it's", "don't", "x2", "1234",
              "3.14", "!!", "--", "...", "(a)", "emoji 🙂", "tab\tsep", "\u00a0nbsp", "\u3000ideo", "CR\r\nLF"]
    seps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n ", ""]
    return "".join(pieces[rng.integers(len(pieces))] + seps[rng.integers(len(seps))] for _ in range(words))


def check_bpe(kiln, work):
    corpus, other = os.path.join(work, "bpe_corpus.txt"), os.path.join(work, "bpe_other.txt")
    with open(corpus, "w", encoding="utf-8", newline="") as f:
        f.write(generated_text(1, 20000))
    with open(other, "w", encoding="utf-8", newline="") as f:
        f.write(generated_text(2, 5000) + "  trailing spaces   \n\n\n   ")
    weights, json = os.path.join(work, "bpe.h5"), os.path.join(work, "tokenizer.json")
    subprocess.run([kiln, "train", "--tokenizer", "bpe", "--bpe-vocab", "600", "--data", corpus, "--layers", "1",
                    "--embd", "16", "--heads", "2", "--block", "8", "--batch", "2", "--steps", "1",
                    "--eval-every", "1", "--out", weights], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    subprocess.run([kiln, "tokenize", "--weights", weights, "--json", json], check=True, stdout=subprocess.DEVNULL)
    hf = tokenizers.Tokenizer.from_file(json)
    failures = []
    for name, path in (("training corpus", corpus), ("other text", other)):
        ids_file = path + ".ids"
        subprocess.run([kiln, "tokenize", "--weights", weights, "--data", path, "--out", ids_file],
                       check=True, stdout=subprocess.DEVNULL)
        kiln_ids = np.fromfile(ids_file, dtype="<u2").tolist()
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        hf_ids = hf.encode(text).ids
        same = hf_ids == kiln_ids
        print(f"bpe {name}: {len(text)} characters, kiln {len(kiln_ids)} tokens, tokenizers {len(hf_ids)}, "
              f"{'identical' if same else 'DIFFERENT'}; decode round trip {hf.decode(hf_ids) == text}")
        if not same:
            at = first_difference(hf_ids, kiln_ids)
            failures.append(f"bpe {name}: first difference at token {at}: tokenizers {hf_ids[at:at + 5]}, "
                            f"kiln {kiln_ids[at:at + 5]}")
        if hf.decode(hf_ids) != text:
            failures.append(f"bpe {name}: tokenizers does not decode kiln's tokens back to the text")
    return failures


def main():
    kiln, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    keep_f64_in_rms_norm_and_softmax()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    failures = check(kiln, work, tied=False) + check(kiln, work, tied=True) + check_bpe(kiln, work)
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
