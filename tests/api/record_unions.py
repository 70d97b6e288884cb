"""Record the union-typed field goldens (tests/api/golden/unions.json) from vLLM 0.33.

    python -m tests.api.record_unions [--oracle-url URL] [--port PORT]

See tests/api/recording.py. Not imported by the tests.
"""

from tests.api.recording import main
from tests.api.union_corpus import GOLDEN, cases, request

if __name__ == "__main__":
    main(GOLDEN, cases, request)
