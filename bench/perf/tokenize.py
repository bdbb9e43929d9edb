"""``python bench/tokenize.py``: tokenize-and-pack throughput against ``Tokenizer.encode_batch``.

The benchmark lives in ``tokenize_pack.py``. This file only has this name, and a file
called tokenize.py in bench/ shadows the standard library's ``tokenize`` for every script
run from bench/ (their folder is sys.path[0]). So when it is imported as ``tokenize``,
it puts the standard library module in its place and does nothing else.
"""

import os
import sys

if __name__ == "tokenize":
    _here = os.path.dirname(os.path.abspath(__file__))
    _saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    del sys.modules["tokenize"]
    import tokenize as _stdlib_tokenize  # the import system returns sys.modules["tokenize"]: this one

    sys.path[:] = _saved
    sys.modules["tokenize"] = _stdlib_tokenize
elif __name__ == "__main__":
    from tokenize_pack import main

    main()
