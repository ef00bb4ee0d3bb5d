"""Two set-ups at once on a fresh machine (two `make test` side by side) install a missing Debian package once: they
take turns, and the second finds it installed, instead of losing apt's lock and failing. apt-get is played by a script
on PATH that takes a second to install (the real one would change this machine); devstack's own code runs as is."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_two_setups_at_once_install_a_missing_package_once_and_both_find_it(tmp_path):
    assert os.geteuid() == 0, "devstack installs Debian packages only as root, as make test runs on a fresh machine"
    command, log = tmp_path / "bin" / "some-tool", tmp_path / "apt.log"
    fake = tmp_path / "fake-apt" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$1" >> {log}
        if [ "$1" = install ]; then
            sleep 1
            mkdir -p {command.parent} && printf '#!/bin/sh\\n' > {command} && chmod +x {command}
        fi
        """))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", TMPDIR=str(tmp_path))
    script = f"from devstack.services import debian_binary; print(debian_binary({str(command)!r}, 'some-tool'))"
    setups = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    answers = [setup.communicate(timeout=60) for setup in setups]
    assert [setup.returncode for setup in setups] == [0, 0], answers
    assert [out.strip().splitlines()[-1] for out, _ in answers] == [str(command)] * 2
    assert log.read_text().split() == ["update", "install"]  # once: the second waited, then found it
