"""One request's chain of thought: the async driver (session.py) that reads the upstream stream
(reader.py), feeds faithcore's correction machine and carries out its actions (check a step, regenerate,
continue), the one detector call that answers a check and the machine's rules for a request (verify.py,
which the shadow check shares), the judge's bill and the hint stage.

Owns: session.py, reader.py, verify.py, judge_bill.py, hints.py. May import: settings, protocol, observe,
admission, runtime.
"""
