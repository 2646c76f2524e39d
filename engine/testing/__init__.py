"""Tools and fixtures beside the engine, never part of it: models built for tests, demos and measurement.

    tiny.py       `build-tiny`: small random-weight models of the real Qwen3.5 layout (the test models)
    script.py     `build-tiny --script`: a tiny model whose weights make greedy decoding emit a given text
    demo.py       the embedded demo model (`ninfer-serve` / `LLM()` with no artifact): tiny.py's, cached
    geometry.py   the synthetic geometries' names (no torch: flag parsers import it)
    synthetic.py  random weights of a real geometry drawn on the device (`--synthetic`)
    bench/        `ninfer-bench`: speed at the real geometries on a GPU

The engine's core never imports this package (`.importlinter`, contract "testing-outside-core"). Only entry
points may: `engine.llm` (LLM() with no artifact serves the demo model), `engine.artifact.cli`
(`ninfer-artifact build-tiny`), and everything outside `engine` (api/serve.py for `--synthetic` and the demo
model, tests, bench/ scripts). The arrows point into this package, never out of the core.
"""
