from patchkit.cli import main

main(prog_name="patchkit")
