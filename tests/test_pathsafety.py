"""Which paths gpuwarden trusts (OpenSSH's StrictModes, every component from /), checked on
real directories with real owners and modes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden import pathsafety
from gpuwarden.pathsafety import UnsafePath, open_directory, path_problems

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files other owners")


def test_a_private_path_has_no_problem(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(mode=0o755)
    (tmp_path / "a" / "f").write_text("x")
    assert path_problems(tmp_path / "a" / "f") == []


def test_every_component_is_checked_from_the_root(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "mid").mkdir(parents=True)
    (top / "mid" / "f").write_text("x")
    top.chmod(0o777)
    (top / "mid").chmod(0o775)
    found = {u.path: u for u in path_problems(top / "mid" / "f")}
    assert set(found) == {str(top), str(top / "mid")}
    assert found[str(top)].problem == "writable by group or others (mode drwxrwxrwx)"
    assert found[str(top)].fix == f"chmod go-w {top}"


def test_a_root_owned_sticky_directory_is_accepted_only_when_root_owns_it(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    inside = sticky / "x"
    inside.mkdir(mode=0o755)
    owner = os.stat(sticky).st_uid
    problems = path_problems(inside)
    if owner == 0:
        assert problems == []  # like /tmp: nobody can replace an entry they do not own
    else:
        assert [u.path for u in problems] == [str(sticky)]


@needs_root
def test_another_owner_is_a_problem_and_a_links_own_owner_counts(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    (problem,) = path_problems(link)
    assert problem.path == str(link)
    assert problem.problem.startswith(f"owned by uid {NOBODY}")
    assert problem.fix.startswith(f"chown root {link}")
    os.chown(target, NOBODY, NOBODY)
    assert {u.path for u in path_problems(link)} == {str(link), str(target)}


def test_open_directory_creates_what_is_missing_with_its_mode(tmp_path: Path) -> None:
    wanted = tmp_path / "run" / "gpuwarden" / "ack"
    fd = open_directory(wanted, create_mode=0o755)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(wanted))
    finally:
        os.close(fd)
    assert [oct(os.stat(p).st_mode & 0o777) for p in (wanted.parent, wanted)] == ["0o755"] * 2
    with pytest.raises(FileNotFoundError):
        open_directory(tmp_path / "absent")


def test_open_directory_never_follows_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePath, match="alias is a symbolic link: give the"):
        open_directory(tmp_path / "alias" / "below", create_mode=0o755)
    assert not (tmp_path / "real" / "below").exists()


def test_open_directory_refuses_a_component_others_can_write(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(UnsafePath) as refused:
        open_directory(tmp_path / "open" / "ack", create_mode=0o755)
    assert refused.value.unsafe == pathsafety.Unsafe(
        str(tmp_path / "open"),
        "writable by group or others (mode drwxrwxrwx)",
        f"chmod go-w {tmp_path / 'open'}",
    )
    assert not (tmp_path / "open" / "ack").exists()
