"""`python -m tfps.launch`: the same as the `tfps-launch` command (tfps.cluster.launch)."""

from tfps.cluster.launch import main

if __name__ == "__main__":
    main()
