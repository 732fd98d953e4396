from ggmlrun.cli import main

main()
