"""`python -m p2p_diloco` is the same as the `p2p-diloco` console script."""

from p2p_diloco.cli import main

if __name__ == "__main__":
    main()
