"""Throughput of torch's DataLoader on bench_loader's file of gzip'd images: the same decode
(zlib), f x f block averages down to 28x28 scaled to [0, 1] per sample, batches of 64, one intra-op thread.

    python loader_torch.py FILE ROUND      one JSON line per worker count (0, 1, 2)
"""
import json
import struct
import sys
import time
import zlib

import torch

BATCH = 64


def read_images(path):
    with open(path, "rb") as f:
        data = f.read()
    count, side = struct.unpack_from("<QI", data, 0)
    offset, blobs, labels = 12, [], []
    for _ in range(count):
        label, size = struct.unpack_from("<BI", data, offset)
        offset += 5
        blobs.append(data[offset:offset + size])
        labels.append(label)
        offset += size
    return side, blobs, labels


class GzipImages(torch.utils.data.Dataset):
    def __init__(self, side, blobs, labels):
        self.side, self.blobs, self.labels = side, blobs, labels

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        pixels = torch.frombuffer(bytearray(zlib.decompress(self.blobs[i])), dtype=torch.uint8)
        image = pixels.reshape(1, 1, self.side, self.side).to(torch.float32).div_(255)
        return torch.nn.functional.avg_pool2d(image, self.side // 28).reshape(784), torch.tensor(self.labels[i])


def init_worker(_):
    torch.set_num_threads(1)


if __name__ == "__main__":
    torch.set_num_threads(1)
    dataset = GzipImages(*read_images(sys.argv[1]))
    for workers in (0, 1, 2):
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                             worker_init_fn=init_worker if workers else None)
        start, samples = time.perf_counter(), 0
        for x, y in loader:
            samples += x.shape[0]
        rate = samples / (time.perf_counter() - start)
        print(json.dumps({"side": "torch", "round": int(sys.argv[2]), "variant": f"loader_only_workers_{workers}",
                          "samples_per_s": rate}), flush=True)
