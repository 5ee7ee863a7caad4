#!/bin/sh
# output_paths.sh - what `wna16 repack -o PATH` does with each kind of PATH
# and with signals (runtime/output.h states the rules): a FIFO, a character
# device and - are streamed to and stay what they are; a symbolic link's
# target is written and the link kept; a directory (or a link to one)
# becomes a checkpoint directory of shards, index and config.json, and the
# link stays; a socket, a block device and a dangling link into a missing
# directory are refused; SIGINT and
# SIGTERM leave no temporary; SIGKILL leaves one, which the next run removes
# and names, as it does any stale temporary whose process is gone. Each CASE
# runs in WORKDIR (emptied first) on a checkpoint make_checkpoint.py writes,
# so no golden files are needed. Exit 0 passed, 1 failed (the reason is
# printed), 77 skipped (the case needs root).
#
# usage: output_paths.sh CASE WNA16 WORKDIR
set -u
c=$1 W=$2 d=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$d" && mkdir -p "$d" && cd "$d" || exit 1

fail() { echo "FAIL ($c): $*"; exit 1; }
skip() { echo "SKIP ($c): $*"; exit 77; }
# ck/: 1 layer, 2 experts, 256 x 256 (a moment); big/: 3 layers of 1024 x
# 1024 through the scalar reference (seconds a layer: the signal tests'
# temporary lives long enough to be seen).
make_ck() {
    python3 "$here/make_checkpoint.py" "$@" || fail "cannot make $1"
}
small() { make_ck ck 1 2 256 256; }
big() { make_ck big 3 2 1024 1024; }
# repack CHECKPOINT OUT: the repack every case runs; the log is in log.
repack() {
    "$W" repack "$1" --to marlin --target reference -q -o "$2" >log 2>&1
}
# Temporaries of OUT (a plain name in .) left here.
tmps() { ls -a | grep -c "^$1[.]tmp[.]"; }
expect_ok() {
    [ "$1" = 0 ] || fail "exit $1: $(cat log)"
}
# expect_refused RC MESSAGE: exit 1 with MESSAGE (a grep pattern) in log.
expect_refused() {
    [ "$1" = 1 ] || fail "exit $1, expected 1: $(cat log)"
    grep -q "$2" log || fail "no '$2' in: $(cat log)"
}
# The reference bytes: the same repack to a regular file.
reference() {
    repack ck ref.st
    expect_ok $?
}

# start_big: a long repack in the background, its pid in $pid, once its
# temporary exists. A script's background job ignores SIGINT; env puts the
# default action back, as an interactive shell would have it.
start_big() {
    env --default-signal=INT true 2>/dev/null ||
        skip "env has no --default-signal"
    big
    env --default-signal=INT,TERM,HUP "$W" repack big --to marlin \
        --target reference -q -o out.st >log 2>&1 &
    pid=$!
    i=0
    while [ "$(tmps out.st)" = 0 ]; do
        kill -0 "$pid" 2>/dev/null ||
            fail "repack ended before its temporary appeared: $(cat log)"
        i=$((i + 1))
        if [ $i -gt 1200 ]; then
            kill -KILL "$pid"
            fail "no temporary after 60 s"
        fi
        sleep 0.05
    done
}

# by_signal NAME NUMBER: the repack dies of it and leaves nothing.
by_signal() {
    start_big
    kill -"$1" "$pid"
    wait "$pid"
    rc=$?
    [ $rc = $((128 + $2)) ] || fail "exit $rc, expected $((128 + $2)) ($1)"
    [ "$(tmps out.st)" = 0 ] || fail "SIG$1 left $(ls -a | grep tmp)"
    [ ! -e out.st ] || fail "SIG$1 left a file at out.st"
    echo "ok: SIG$1 removed the temporary"
}

case $c in
devnull)
    # The reported bug renamed a regular file over /dev/null: run as root
    # only (no one else could), and put it back if it happens again.
    [ "$(id -u)" = 0 ] || skip "not root"
    small
    repack ck /dev/null
    rc=$?
    if [ ! -c /dev/null ]; then
        rm -f /dev/null && mknod -m 666 /dev/null c 1 3
        fail "/dev/null is no longer a character device (restored)"
    fi
    expect_ok $rc
    [ "$(ls -a /dev | grep -c '^null[.]tmp[.]')" = 0 ] ||
        fail "temporaries left in /dev"
    # a character device of our own (the same as /dev/null) here
    if mknod -m 666 mynull c 1 3 2>/dev/null; then
        repack ck mynull
        expect_ok $?
        [ -c mynull ] || fail "mynull is no longer a character device"
        [ "$(tmps mynull)" = 0 ] || fail "temporaries left"
    fi
    echo "ok: /dev/null is still a character device"
    ;;
fifo)
    small
    reference
    mkfifo f || fail "mkfifo"
    cat f >copy &
    reader=$!
    repack ck f
    rc=$?
    if [ ! -p f ] || [ $rc != 0 ]; then
        kill "$reader" 2>/dev/null
        [ -p f ] || fail "f is no longer a FIFO: $(ls -l f)"
        expect_ok $rc
    fi
    wait "$reader"
    cmp ref.st copy || fail "the FIFO's reader got other bytes"
    [ "$(tmps f)" = 0 ] || fail "temporaries left"
    echo "ok: streamed to the FIFO, same bytes"
    ;;
stdout)
    small
    reference
    # stdout a pipe: the exit status goes through a file
    { "$W" repack ck --to marlin --target reference -q -o - 2>log
      echo $? >rc; } | sha256sum >got
    expect_ok "$(cat rc)"
    sha256sum <ref.st >want
    cmp -s want got || fail "sha256 of -o - differs: $(cat got) vs $(cat want)"
    [ ! -e ./- ] || fail "a file named - was written"
    grep -q "^wrote standard output: " log || fail "summary: $(cat log)"
    echo "ok: -o - | sha256sum is the file's"
    ;;
symlink)
    small
    reference
    # a dangling link into an existing directory: its target is created
    ln -s target.st link
    repack ck link
    expect_ok $?
    [ -L link ] && [ "$(readlink link)" = target.st ] ||
        fail "the link was replaced: $(ls -l link)"
    [ -f target.st ] && cmp -s ref.st target.st ||
        fail "target.st is not the output"
    # a link to a regular file, through a relative link in a subdirectory
    # (resolved from the link's directory): the target is replaced
    mkdir sub && ln -s ../link sub/l2 && echo old >target.st
    repack ck sub/l2
    expect_ok $?
    [ -L sub/l2 ] && [ -L link ] || fail "a link was replaced"
    cmp -s ref.st target.st || fail "target.st was not replaced"
    [ "$(tmps target.st)" = 0 ] && [ "$(tmps link)" = 0 ] ||
        fail "temporaries left"
    echo "ok: the targets written, the links kept"
    ;;
symlink_missing_dir)
    small
    ln -s nodir/x.st dang
    repack ck dang
    expect_refused $? "dang: a symbolic link to nodir/x.st, whose directory nodir does not exist"
    [ -L dang ] && [ ! -e nodir ] || fail "something was created"
    [ "$(ls -a | grep -c tmp)" = 0 ] || fail "temporaries left"
    echo "ok: refused"
    ;;
directory)
    # a checkpoint directory (issue 28): the shards, the index and the
    # config, written through the link too, which stays a link
    small
    mkdir outdir
    ln -s outdir dlink
    repack ck outdir
    expect_ok $?
    [ "$(ls outdir | tr '\n' ' ')" = "config.json model-00001-of-00001.safetensors model.safetensors.index.json " ] ||
        fail "outdir holds: $(ls outdir)"
    cmp -s ck/config.json outdir/config.json || fail "config.json differs"
    rm outdir/*
    repack ck dlink
    expect_ok $?
    [ -L dlink ] && [ -f outdir/model.safetensors.index.json ] ||
        fail "the link was not followed or not kept"
    [ "$(ls -a . outdir | grep -c tmp)" = 0 ] || fail "temporaries left"
    echo "ok: checkpoint directories, the link kept"
    ;;
socket)
    small
    python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' sock ||
        fail "cannot make a socket"
    repack ck sock
    expect_refused $? "sock: is a socket, not an output file"
    [ -S sock ] || fail "sock is no longer a socket"
    [ "$(tmps sock)" = 0 ] || fail "temporaries left"
    echo "ok: refused"
    ;;
blockdev)
    [ "$(id -u)" = 0 ] || skip "not root"
    small
    mknod blk b 7 250 2>/dev/null || skip "mknod is not allowed here"
    repack ck blk
    expect_refused $? "blk: is a block device, not an output file"
    [ -b blk ] || fail "blk is no longer a block device"
    [ "$(tmps blk)" = 0 ] || fail "temporaries left"
    echo "ok: refused"
    ;;
sigint) by_signal INT 2 ;;
sigterm) by_signal TERM 15 ;;
sighup) by_signal HUP 1 ;;
sigkill)
    start_big
    kill -KILL "$pid"
    wait "$pid"
    rc=$?
    [ $rc = 137 ] || fail "exit $rc, expected 137"
    [ "$(tmps out.st)" = 1 ] || fail "SIGKILL should leave the temporary"
    stale=$(ls -a | grep "^out[.]st[.]tmp[.]")
    small
    repack ck out.st
    expect_ok $?
    grep -q "removed stale temporary $stale (process $pid is gone)" log ||
        fail "no word of $stale: $(cat log)"
    [ "$(tmps out.st)" = 0 ] && [ -f out.st ] || fail "$stale is still here"
    echo "ok: the next run removed $stale"
    ;;
stale)
    small
    sh -c 'echo $$ >dead'
    dead=$(cat dead)
    kill -0 "$dead" 2>/dev/null && skip "pid $dead was reused at once"
    : >"out.st.tmp.$dead.0"     # stale: removed
    : >"out.st.tmp.$$.3"        # this shell's: alive, kept
    : >"other.st.tmp.$dead.0"   # another output's: kept
    : >"out.st.tmp.$dead.x"     # not the naming: kept
    mkdir "out.st.tmp.$dead.1"  # not a regular file: kept
    repack ck out.st
    expect_ok $?
    [ "$(grep -c 'removed stale temporary' log)" = 1 ] &&
        grep -q "removed stale temporary out.st.tmp.$dead.0 (process $dead is gone)" log ||
        fail "expected one message for out.st.tmp.$dead.0: $(cat log)"
    [ ! -e "out.st.tmp.$dead.0" ] || fail "the stale temporary is still here"
    for k in "out.st.tmp.$$.3" "other.st.tmp.$dead.0" "out.st.tmp.$dead.x" \
             "out.st.tmp.$dead.1"; do
        [ -e "$k" ] || fail "$k was removed"
    done
    echo "ok: removed the stale temporary only"
    ;;
*)
    echo "usage: output_paths.sh CASE WNA16 WORKDIR (unknown case '$c')"
    exit 2
    ;;
esac
