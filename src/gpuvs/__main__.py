from gpuvs.cli import main

main()
