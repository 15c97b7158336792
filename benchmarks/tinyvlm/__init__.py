"""The repo's own tiny Qwen2.5-VL fixture model: built from code, trained on CPU, served by real vLLM.

`fixture_spec` says what the model must say, `examples` turns that into chat requests, `tokenizer`,
`build`, `batching` and `train_fixture` make the model (`build` and `batching` serve ShapesWorld's model
too), `hf_reference` runs it in transformers, `serve` starts vLLM for it. `processes` starts, awaits
and stops every child process the repo runs (vLLM, the proxy, stand-ins). Build the model with
`scripts/build_fixture_model.sh` (into var/models/fixture-vlm).

The reasoning-format models (`formats_spec`, `chat_templates`, `train_formats`) are one more tiny
model of the same kind, written once per family with that family's real chat template (Qwen3-VL-Thinking,
GLM-4.1V-Thinking, Qwen2.5-VL), into var/models/formats by the same script.
"""
