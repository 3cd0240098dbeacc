"""Run by tests as a separate process: `zarrfeed convert ARGS...`, pausing before each episode it reads from the
source, so that it can be killed mid-way (the command's own code otherwise: its parser, writer and commits).

    python convert_child.py SECONDS_PER_EPISODE SOURCE OUT [convert's options]
"""
import sys
import time

from zarrfeed.cli import main
from zarrfeed.writer import dataset_episodes

if __name__ == "__main__":
    pause = float(sys.argv[1])
    read = dataset_episodes.Episodes._episode

    def slowly(self, *args):
        time.sleep(pause)
        return read(self, *args)

    dataset_episodes.Episodes._episode = slowly
    sys.exit(main(["convert", *sys.argv[2:]]))
