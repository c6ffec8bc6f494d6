from tiergate.cli import main

main()
