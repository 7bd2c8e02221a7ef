"""The code that runs in the processes judging a program: the program's sandboxed process
(runner.py, which isolates itself with isolate.py and seccomp.py) and the checker beside it
(checker.py, channel.py), with the plain data both speak (wire.py, decoder.py).

The rule: the standard library only, and never the host side (mentor_fast.rewards and the rest of
mentor_fast); the host imports these modules, never the other way round. These processes are bare
`python -I -S` interpreters with an empty environment, and the sandbox shows them no site-packages
and no checkout. Their code comes from the host, compiled and marshalled on stdin (rewards/sandbox.py:
`code_blob`, `LOADER`), so a module imports a sibling by its full name (`from
mentor_fast.rewards.inside import wire`), and the package is shipped whole. tests/test_code_boundary.py
holds both.
"""
