"""The offline evaluation users run: `faithproxy bench` and what it is built from."""
