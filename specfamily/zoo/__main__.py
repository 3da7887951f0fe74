from specfamily.zoo.cli import main

main()
