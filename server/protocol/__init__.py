"""What a door is and what every door shares of its wire: the `Door` and its table (doors.py), the
renderer a door writes its responses with (render.py), its wires to vLLM (wires.py: its rounds, the
shadow check's reader), the error bodies (errors.py: OpenAI's or Anthropic's), and the SSE frames.

Owns: doors.py, render.py, wires.py, errors.py, sse.py. May import: settings (and faithcore, clients).
Everything else in the server reads a door from here; a door itself is declared in its module of doors/.
"""
