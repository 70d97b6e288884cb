"""`render-service serve | fingerprint | example-model`."""

from __future__ import annotations

import argparse
import logging
import sys

from render_service.settings import (
    SettingsError,
    add_model_arguments,
    add_server_arguments,
    apply_environment,
    settings_from_args,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="render-service", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve the render/derender endpoints (every flag also as RENDER_<FLAG> in the environment)"
    )
    add_model_arguments(serve)
    add_server_arguments(serve)
    apply_environment(serve)
    fp = commands.add_parser("fingerprint", help="print the config fingerprint without starting a server")
    add_model_arguments(fp)
    audit = commands.add_parser("audit", help="check render replicas and engines agree (see README)", add_help=False)
    audit.add_argument("rest", nargs=argparse.REMAINDER)
    example = commands.add_parser("example-model", help="build a tiny local model folder (no hub needed)")
    example.add_argument("directory")
    example.add_argument(
        "--family", default="qwen3", choices=("qwen3", "deepseek", "qwen3-vl", "minimax_m2", "seed_oss")
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["audit"]:  # its own parser: options may come before MODEL
        from render_service.audit.audit import main_audit

        return main_audit(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "example-model":
        from render_service.model.example import build_example_model

        print(build_example_model(args.directory, args.family))
        return 0
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"render-service: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(settings)
    if args.command == "fingerprint":
        return print_fingerprint(settings)
    return 1


def print_fingerprint(settings) -> int:
    import json

    from render_service import __version__
    from render_service.audit.fingerprint import fingerprint
    from render_service.model.loader import ModelLoadError, load_model

    try:
        model = load_model(settings)
    except ModelLoadError as exc:
        print(f"render-service: error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {**fingerprint(settings, model), "vllm_parity_version": "0.33.0", "service_version": __version__},
            indent=2,
            ensure_ascii=False,
            default=str,
        )
    )
    return 0


def serve(settings) -> int:
    import os

    # Workers are forked after the model loads: keep HF tokenizers' thread pool out of it.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from render_service.model.loader import ModelLoadError, load_model
    from render_service.server import workers
    from render_service.server.app import create_app

    try:
        model = load_model(settings)
    except ModelLoadError as exc:
        print(f"render-service: error: {exc}", file=sys.stderr)
        return 2
    count = settings.workers or workers.available_cpus()
    if count > 1:
        workers.main_guard()
    return workers.serve(lambda: create_app(settings, model), settings.host, settings.port, count, settings.log_level)


if __name__ == "__main__":
    sys.exit(main())
