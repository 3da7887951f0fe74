from specfamily.recipes.cli import main

main()
