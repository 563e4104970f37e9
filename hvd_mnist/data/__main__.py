"""`python -m hvd_mnist.data`: convert a dataset to TFRecords, or download the MNIST IDX files."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from hvd_mnist.data.download import MNIST_MIRROR, download_mnist
from hvd_mnist.data.sources import DATASETS, load_dataset
from hvd_mnist.errors import UserError

log = logging.getLogger("hvd_mnist.data")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hvd_mnist.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="write train.tfrecords and test.tfrecords")
    convert.add_argument("--dataset", choices=DATASETS, default="mnist")
    convert.add_argument("--data-dir", type=Path, help="IDX files; default: the offline sample / Debian package")
    convert.add_argument("--out-dir", type=Path, required=True, help="where to write the TFRecord files")
    download = commands.add_parser("download", help="download MNIST's IDX files and verify their SHA-256")
    download.add_argument("--dest", type=Path, required=True)
    download.add_argument("--mirror", default=MNIST_MIRROR)
    return parser


def run(args: argparse.Namespace) -> None:
    if args.command == "download":
        log.info("MNIST files verified in %s", download_mnist(args.dest, args.mirror))
        return
    from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    from hvd_mnist.data.records import write_records

    dataset = load_dataset(args.dataset, args.data_dir)
    log.info("converting %s", dataset.description)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, split in (("train", dataset.train), ("test", dataset.test)):
        path = args.out_dir / f"{name}.tfrecords"
        log.info("wrote %d examples to %s", write_records(path, split), path)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(build_parser().parse_args(argv))
    except UserError as err:
        print(f"hvd_mnist.data: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
