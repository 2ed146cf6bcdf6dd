"""``python -m linred.bench``: the same as ``linred bench``."""

import argparse
import sys

from linred.bench import add_arguments, run

parser = argparse.ArgumentParser(prog="python -m linred.bench")
add_arguments(parser)
sys.exit(run(parser.parse_args()))
