"""examples/gpt's model written with torch.nn, for the parity check (gpt_parity.py) and the
side-by-side benchmark (bench/python/gpt_torch.py): the same parameter names, so that the
safetensors files the example writes load with strict=True.
"""
import math
import os

import torch
import torch.nn.functional as F


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.qkv = torch.nn.Linear(embd, 3 * embd)
        self.proj = torch.nn.Linear(embd, embd)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(torch.nn.Module):
    def __init__(self, embd, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(embd)
        self.attn = CausalSelfAttention(embd, heads)
        self.ln2 = torch.nn.LayerNorm(embd)
        self.fc = torch.nn.Linear(embd, 4 * embd)
        self.proj = torch.nn.Linear(4 * embd, embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab_size, block_size, layers, heads, embd):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, embd)
        self.wpe = torch.nn.Embedding(block_size, embd)
        self.blocks = torch.nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(embd)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the head tied to the token embedding


def schedule(run):
    """transformers' get_cosine_schedule_with_warmup with a floor, as a LambdaLR factor."""
    warmup, total, floor = run["warmup"], run["steps"], run["min_lr_ratio"]

    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * max(0.0, 0.5 * (1 + math.cos(math.pi * progress)))

    return factor


def generate(model, prompt, count, block_size):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(count):
            context = torch.tensor(ids[-block_size:]).unsqueeze(0)
            ids.append(int(model(context)[0, -1].float().argmax()))
    return ids


def read_corpus(path):
    """The example's corpus: a file, or a directory's regular files in name order (fortune's
    .dat index files and links left out), lines of "%" as blank lines; as byte ids."""
    files = [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path)
                       if not n.endswith(".dat") and not os.path.islink(os.path.join(path, n))
                       and os.path.isfile(os.path.join(path, n)))
    text = bytearray()
    for name in files:
        with open(name, "rb") as f:
            lines = f.read().split(b"\n")
        if lines[-1] == b"":  # a final newline ends the last line; it starts none
            lines.pop()
        for line in lines:
            text += b"\n" if line == b"%" else line + b"\n"
    return torch.frombuffer(text, dtype=torch.uint8).long()
