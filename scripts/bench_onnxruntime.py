#!/usr/bin/env python3
"""Reference throughput: the same all-MiniLM-L6-v2 int8 files run by Python's onnxruntime.

Used by `cargo bench -p cairn-embed --bench embed_throughput`, which passes the model
directory, a file of sentences (one per line), the batch sizes, the thread count and the
number of repetitions. Prints one JSON object: {"batch": [sentences per second per run]}.

Needs: pip install onnxruntime==1.32.0 tokenizers numpy
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def main():
    model_dir, sentences_path, batches, threads, reps = sys.argv[1:6]
    sentences = [s for s in open(sentences_path, encoding="utf-8").read().split("\n") if s]
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(f"{model_dir}/model.onnx", opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    def embed(batch):
        enc = tok.encode_batch(batch)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = np.zeros_like(ids)
        out = sess.run(None, feed)[0]
        m = mask[:, :, None].astype(np.float32)
        pooled = (out * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    embed(sentences[:32])  # warm-up
    result = {}
    for b in [int(x) for x in batches.split(",")]:
        runs = []
        for _ in range(int(reps)):
            t = time.perf_counter()
            for i in range(0, len(sentences), b):
                embed(sentences[i:i + b])
            runs.append(len(sentences) / (time.perf_counter() - t))
        result[str(b)] = runs
    print(json.dumps(result))


if __name__ == "__main__":
    main()
