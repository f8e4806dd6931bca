"""``python -m asymvlm.synthetic``: write a synthetic world (:mod:`asymvlm.synthetic.cli`)."""

from asymvlm.synthetic.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
