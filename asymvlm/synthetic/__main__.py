"""``python -m asymvlm.synthetic``: write a synthetic world (:mod:`.command_line`)."""

from asymvlm.synthetic.command_line import main

if __name__ == "__main__":
    raise SystemExit(main())
