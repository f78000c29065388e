#!/usr/bin/env python3
"""kiln's Hugging Face import and export against transformers (`kiln import`, `kiln export`).

transformers makes small random GPT2LMHeadModel and LlamaForCausalLM models (grouped-query
heads, tied and untied heads) and writes them with save_pretrained (safetensors); `kiln import`
reads each directory and `kiln dump` runs one batch: kiln's logits, loss and every gradient must
agree with transformers' on the same weights, as ||kiln - transformers|| / ||transformers||:
f64 to 1e-9, f32 to 1e-5 (logits, loss) and 1e-4 (gradients). Round trips: kiln -> HF -> kiln is
bit-exact (every dataset), HF -> kiln -> HF loads with from_pretrained with no missing,
unexpected or mismatched keys and gives the same logits; a bf16 export loads too. `kiln train
--init-from` a GPT-2 directory starts from transformers' validation loss and lowers it. Nothing
is downloaded.

Exits 77 (skipped) when torch, transformers or h5py is missing.

    python3 scripts/check_hf_models.py build/examples/kiln WORKDIR
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_against_transformers import (datasets_by_name, first_difference, generated_text,  # noqa: E402
                                        keep_f64_in_rms_norm_and_softmax, rel, report)

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
VOCAB, BLOCK = 50, 16


def run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


def f64_rotary(model, failures):
    """transformers' rotary embedding kept in f64 (it computes its frequencies and tables in f32
    whatever the model's dtype): the same formulas, default or llama3, in f64; checked against
    transformers' own f32 frequencies (1e-6), so that the reference is transformers' rope."""
    config = model.config
    rope = config.rope_parameters
    dim = config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    theirs = model.model.rotary_emb.inv_freq.to(torch.float64)
    if rel(inv_freq.numpy(), theirs.numpy()) > 1e-6:
        failures.append(f"the f64 rotary frequencies differ from transformers' ({rope})")

    class F64(torch.nn.Module):
        def forward(self, x, position_ids):
            freqs = position_ids[..., None].to(torch.float64) * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return F64()


def compare(kiln, work, name, hf_dir, model_f64, failures):
    """Imports hf_dir, dumps one batch in f32 and f64 and compares with model_f64 (the
    transformers model, in f64, on the same weights)."""
    weights = os.path.join(work, name + ".h5")
    run(kiln, "import", hf_dir, "--out", weights)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, VOCAB, size=(3, BLOCK + 1), dtype=np.int32)
    batch = os.path.join(work, name + "_batch.h5")
    with h5py.File(batch, "w") as f:
        f["x"], f["y"] = ids[:, :BLOCK], ids[:, 1:]
    x, y = torch.from_numpy(ids[:, :BLOCK].astype(np.int64)), torch.from_numpy(ids[:, 1:].astype(np.int64))
    model_f64.zero_grad()
    logits = model_f64(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    named = dict(model_f64.named_parameters())
    for dtype, tol in (("f64", {"logits": 1e-9, "loss": 1e-9, "grad": 1e-9}),
                       ("f32", {"logits": 1e-5, "loss": 1e-5, "grad": 1e-4})):
        dump = os.path.join(work, f"{name}_dump_{dtype}.h5")
        run(kiln, "dump", "--weights", weights, "--batch", batch, "--out", dump, "--dtype", dtype)
        with h5py.File(dump, "r") as d:
            errors = {"logits": rel(d["logits"][()], logits.detach().numpy()),
                      "loss": rel(d["loss"][()], loss.detach().numpy())}
            grads = datasets_by_name(d["grads"])
        missing = set(named) - set(grads)
        if missing:
            failures.append(f"{name} {dtype}: no gradient from kiln for {sorted(missing)}")
        for pname, g in grads.items():
            if pname not in named:
                failures.append(f"{name} {dtype}: kiln has a parameter {pname} that transformers has not")
                continue
            ref = named[pname].grad.numpy()
            errors[pname] = rel(g.T if pname.endswith(CONV1D) else g, ref)
        report(f"{name} {dtype}", errors, tol, len(grads), failures)
    return weights


def round_trips(kiln, work, name, weights, hf_dir, cls, failures):
    """kiln -> HF -> kiln bit-exact; HF -> kiln -> HF loads cleanly with the same logits."""
    out_dir = os.path.join(work, name + "_export")
    run(kiln, "export", weights, "--hf", out_dir)
    back = os.path.join(work, name + "_back.h5")
    run(kiln, "import", out_dir, "--out", back)
    with h5py.File(weights, "r") as a, h5py.File(back, "r") as b:
        da, db = datasets_by_name(a), datasets_by_name(b)
        if sorted(da) != sorted(db):
            failures.append(f"{name}: kiln -> HF -> kiln changed the datasets: {sorted(set(da) ^ set(db))}")
        for k in da:
            if k in db and (da[k].dtype != db[k].dtype or not np.array_equal(da[k], db[k])):
                failures.append(f"{name}: kiln -> HF -> kiln changed {k}")
        attrs_a = {k: a.attrs[k] for k in a.attrs}
        attrs_b = {k: b.attrs[k] for k in b.attrs}
        if str(attrs_a) != str(attrs_b):
            failures.append(f"{name}: kiln -> HF -> kiln changed the config: {attrs_a} != {attrs_b}")
    original = cls.from_pretrained(hf_dir).eval()
    reloaded, info = cls.from_pretrained(out_dir, output_loading_info=True)
    reloaded.eval()
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    if problems:
        failures.append(f"{name}: from_pretrained of kiln's export reports {problems}")
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, VOCAB, size=(2, BLOCK)))
    with torch.no_grad():
        same = torch.equal(original(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    print(f"{name}: kiln -> HF -> kiln bit-exact over {len(da)} datasets; HF -> kiln -> HF loads "
          f"({'no missing, unexpected or mismatched keys' if not problems else problems}), logits "
          f"{'identical' if same else 'DIFFERENT'}")
    if not same:
        failures.append(f"{name}: HF -> kiln -> HF changed the logits")
    bf16_dir = os.path.join(work, name + "_bf16")
    run(kiln, "export", weights, "--hf", bf16_dir, "--dtype", "bf16")
    m16 = cls.from_pretrained(bf16_dir, dtype=torch.bfloat16)
    if next(m16.parameters()).dtype != torch.bfloat16:
        failures.append(f"{name}: the bf16 export did not load as bf16")
    with open(os.path.join(bf16_dir, "config.json")) as f:
        if json.load(f).get("torch_dtype") != "bfloat16":
            failures.append(f"{name}: the bf16 export's config.json does not say bfloat16")


def init_from(kiln, work, hf_dir, failures):
    """`kiln train --init-from DIR` on pre-tokenized data whose validation split (its last tenth) is
    exactly one block + 1 tokens, so that every validation window is the same: the validation
    loss before training must equal transformers' loss on that window, and training lowers it."""
    tokens = os.path.join(work, "init_from.bin")
    # A random phrase of 5 tokens repeated: something training can learn and validation can see.
    phrase = np.random.default_rng(11).integers(0, VOCAB, size=5)
    ids = np.resize(phrase, 10 * (BLOCK + 1)).astype("<u2")
    ids.tofile(tokens)
    metrics = os.path.join(work, "init_from.metrics.jsonl")
    run(kiln, "train", "--init-from", hf_dir, "--tokens", tokens, "--batch", "4", "--steps", "30", "--eval-every", "30",
        "--lr", "3e-3", "--warmup", "0", "--out", os.path.join(work, "init_from.h5"), "--metrics", metrics,
        "--sample-tokens", "0")
    with open(metrics) as f:
        validation = [r for r in map(json.loads, f) if "val_loss" in r]
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir).to(torch.float64).eval()
    split = len(ids) - len(ids) // 10
    window = torch.from_numpy(ids[split:].astype(np.int64))
    with torch.no_grad():
        logits = model(input_ids=window[None, :-1]).logits[0]
        reference = torch.nn.functional.cross_entropy(logits, window[1:]).item()
    first, last = validation[0], validation[-1]
    error = abs(first["val_loss"] - reference) / reference
    print(f"init-from: validation loss before training {first['val_loss']:.6f} (step {first['step']}), transformers "
          f"{reference:.6f} ({error:.1e} relative); after {last['step']} steps {last['val_loss']:.6f}")
    if first["step"] != 0 or not error < 1e-5:
        failures.append(f"init-from: the first validation loss {first} is not transformers' {reference} (1e-5)")
    if not last["val_loss"] < first["val_loss"]:
        failures.append(f"init-from: training did not lower the validation loss ({first} -> {last})")


def gpt2(kiln, work, failures, name="gpt2", **settings):
    torch.manual_seed(1)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=BLOCK, vocab_size=VOCAB,
                                     bos_token_id=None, eos_token_id=None, **settings)
    hf_dir = os.path.join(work, name)
    transformers.GPT2LMHeadModel(config).save_pretrained(hf_dir)
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="eager").to(torch.float64).eval()
    weights = compare(kiln, work, name, hf_dir, model, failures)
    round_trips(kiln, work, name, weights, hf_dir, transformers.GPT2LMHeadModel, failures)
    return hf_dir


def llama(kiln, work, failures, tied, llama3=False, biases=False):
    torch.manual_seed(2)
    # llama3 scaling with an original context of 8 (of 16): every band of frequencies occurs at head size 8
    # and theta 500 (wavelengths 6.3 to 293: kept below 2, divided above 8, interpolated between).
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8, "rope_theta": 500.0}
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=BLOCK, vocab_size=VOCAB,
                                      rope_theta=500.0, tie_word_embeddings=tied,
                                      rope_scaling=scaling if llama3 else None, attention_bias=biases, mlp_bias=biases,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    name = f"llama_tied{int(tied)}" + ("_llama3" if llama3 else "") + ("_biases" if biases else "")
    hf_dir = os.path.join(work, name)
    transformers.LlamaForCausalLM(config).save_pretrained(hf_dir)
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").to(torch.float64).eval()
    model.model.rotary_emb = f64_rotary(model, failures)
    weights = compare(kiln, work, name, hf_dir, model, failures)
    round_trips(kiln, work, name, weights, hf_dir, transformers.LlamaForCausalLM, failures)


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_tokenizer(kind, corpus):
    """A tokenizer.json as tokenizers makes them: GPT-2's kind (ByteLevel with its own regex, an
    end-of-text token) or Llama 3's (a Split of its pattern, ByteLevel without one, ignore_merges,
    a begin-of-text token the post-processor's template puts first)."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
    if kind == "gpt2":
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    else:
        tok = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer)
    if kind == "llama3":
        # Meta's Llama 3 files wrap the template in a Sequence after a ByteLevel (offsets only).
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    return tok


def check_tokenizers(kiln, work, failures):
    """A tokenizer.json beside the weights is imported: kiln's ids for a mixed-script text (special
    tokens inside it) are tokenizers' own, and kiln export writes it back for AutoTokenizer."""
    corpus = generated_text(1, 8000)
    text = generated_text(2, 3000) + "<|endoftext|> and <|begin_of_text|>, <|end_of_text|>\u00a0x  \n\n  end"
    text_file = os.path.join(work, "tokenizer_text.txt")
    with open(text_file, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    for kind in ("gpt2", "llama3"):
        tok = byte_level_tokenizer(kind, corpus)
        vocab = tok.get_vocab_size()
        hf_dir = os.path.join(work, f"tokenizer_{kind}")
        torch.manual_seed(3)
        if kind == "gpt2":
            config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=BLOCK, vocab_size=vocab)
            transformers.GPT2LMHeadModel(config).save_pretrained(hf_dir)
        else:
            config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=1,
                                              max_position_embeddings=BLOCK, vocab_size=vocab)
            transformers.LlamaForCausalLM(config).save_pretrained(hf_dir)
        tok.save(os.path.join(hf_dir, "tokenizer.json"))
        weights, ids_file = os.path.join(work, f"tokenizer_{kind}.h5"), os.path.join(work, f"tokenizer_{kind}.ids")
        run(kiln, "import", hf_dir, "--out", weights)
        run(kiln, "tokenize", "--weights", weights, "--data", text_file, "--out", ids_file)
        kiln_ids = np.fromfile(ids_file, dtype="<u2").tolist()
        hf_ids = tok.encode(text).ids
        specials = sum(1 for i in hf_ids if tok.id_to_token(i).startswith("<|"))
        same = kiln_ids == hf_ids
        print(f"tokenizer.json ({kind}): {len(text)} characters, tokenizers {len(hf_ids)} ids ({specials} special), "
              f"kiln {len(kiln_ids)}: {'identical' if same else 'DIFFERENT'}")
        if not same:
            at = first_difference(hf_ids, kiln_ids)
            failures.append(f"tokenizer {kind}: first difference at token {at}: tokenizers {hf_ids[at:at + 5]} "
                            f"{[tok.id_to_token(i) for i in hf_ids[at:at + 5]]}, kiln {kiln_ids[at:at + 5]}")
        # gpt2: the text's <|endoftext|>; llama3: the template's <|begin_of_text|> and the text's two.
        if specials != {"gpt2": 1, "llama3": 3}[kind]:
            failures.append(f"tokenizer {kind}: the text's special tokens were not kept ({specials})")
        out_dir = os.path.join(work, f"tokenizer_{kind}_export")
        run(kiln, "export", weights, "--hf", out_dir)
        auto = transformers.AutoTokenizer.from_pretrained(out_dir)
        if auto(text)["input_ids"] != hf_ids:
            failures.append(f"tokenizer {kind}: AutoTokenizer on kiln's export encodes differently")


def main():
    kiln, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    keep_f64_in_rms_norm_and_softmax()
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failures = []
    init_from(kiln, work, gpt2(kiln, work, failures), failures)
    gpt2(kiln, work, failures, "gpt2_inner", n_inner=48, layer_norm_epsilon=1e-6)
    llama(kiln, work, failures, tied=False)
    llama(kiln, work, failures, tied=True)
    llama(kiln, work, failures, tied=False, llama3=True, biases=True)
    check_tokenizers(kiln, work, failures)
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
