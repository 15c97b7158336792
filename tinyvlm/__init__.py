"""The repo's own tiny Qwen2.5-VL fixture model: built from code, trained on CPU, served by real vLLM.

`fixture_spec` says what the model must say, `examples` turns that into chat requests, `tokenizer`,
`build`, `batching` and `train_fixture` make the model (`build` and `batching` serve ShapesWorld's model
too), `hf_reference` runs it in transformers, `serve` starts vLLM for it. `processes` starts, awaits
and stops every child process the repo runs (vLLM, the proxy, stand-ins). Build the model with
`scripts/build_fixture_model.sh` (into var/models/fixture-vlm).
"""
