"""The repo's own tiny Qwen2.5-VL fixture model: built from code, trained on CPU, served by real vLLM.

`fixture_spec` says what the model must say, `examples` turns that into chat requests, `tokenizer`,
`build` and `train_fixture` make the model, `hf_reference` runs it in transformers, `serve` starts
vLLM for it. Build it with `scripts/build_fixture_model.sh` (into var/models/fixture-vlm).
"""
