"""Record the derender validation goldens (tests/api/golden/derender_schema.json) from vLLM 0.33.

    python -m tests.api.record_derender_schema [--oracle-url URL] [--port PORT]

See tests/api/recording.py. Not imported by the tests.
"""

from tests.api.derender_corpus import GOLDEN, cases, request
from tests.api.recording import main

if __name__ == "__main__":
    main(GOLDEN, cases, request)
