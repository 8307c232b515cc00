#!/usr/bin/env bash
# meson install into a DESTDIR puts everything where Debian expects it:
# the binaries, libckpt with its header and pkg-config file, the systemd
# units, the example config, the man pages, and ckpt-example as an example
# only. Prints TAP.
#   check_install.sh BUILD_DIR
build=$1
tmp=$(mktemp -d /tmp/ckpt-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! out=$(meson install -C "$build" --no-rebuild --destdir "$tmp" 2>&1); then
  echo "1..1"; echo "not ok 1 - meson install: $(echo "$out" | tail -3 | tr '\n' ' ')"; exit 1
fi
files=$(cd "$tmp" && find . \( -type f -o -type l \) | sed 's|^\./|/|' | sort)
n=0; bad=0
check() { # description, then a command
  n=$((n + 1)); local d=$1; shift
  if "$@"; then echo "ok $n - $d"; else echo "not ok $n - $d"; bad=1; fi
}
has() { grep -Eq "$1" <<<"$files"; }
hasnt() { ! grep -Eq "$1" <<<"$files"; }
echo "1..18"
check "ckptd in sbin" has '/sbin/ckptd$'
check "ckptctl in bin" has '/bin/ckptctl$'
check "ckpt-bench in bin" has '/bin/ckpt-bench$'
check "ckpt-example not in bin" hasnt '/bin/ckpt-example$'
check "ckpt-example among the examples" has '/share/doc/ckptd/examples/ckpt-example$'
check "libckpt.so.2 and its development link" bash -c "grep -Eq '/libckpt\.so\.2$' <<<'$files' && grep -Eq '/libckpt\.so$' <<<'$files'"
check "ckpt/ckpt.h" has '/include/ckpt/ckpt\.h$'
check "libckpt.pc" has '/pkgconfig/libckpt\.pc$'
check "ckptd.service" has '/systemd/system/ckptd\.service$'
check "ckptd.socket" has '/systemd/system/ckptd\.socket$'
check "the unit's user, for systemd-sysusers" has '/sysusers\.d/ckptd\.conf$'
check "ckptd(8)" has '/man/man8/ckptd\.8$'
check "ckptctl(1)" has '/man/man1/ckptctl\.1$'
check "ckptd.conf(5)" has '/man/man5/ckptd\.conf\.5$'
check "the example config in etc and among the examples" bash -c "grep -Eq '/etc/ckptd/ckptd\.conf\.example$' <<<'$files' && grep -Eq '/share/doc/ckptd/examples/ckptd\.conf\.example$' <<<'$files'"
check "LICENSE, README and the manual in the docs" bash -c "grep -Eq '/share/doc/ckptd/LICENSE$' <<<'$files' && grep -Eq '/share/doc/ckptd/README\.md$' <<<'$files' && grep -Eq '/share/doc/ckptd/manual\.md$' <<<'$files' && grep -Eq '/share/doc/ckptd/architecture\.md$' <<<'$files'"
unit=$(grep -E '/systemd/system/ckptd\.service$' <<<"$files" | head -1)
sbin=$(dirname "$(grep -E '/sbin/ckptd$' <<<"$files" | head -1)")
check "the installed unit starts the installed ckptd" grep -q "^ExecStart=$sbin/ckptd " "$tmp$unit"
lib=$(dirname "$(grep -E '/libckpt\.so\.2$' <<<"$files" | head -1)")
ctl=$(grep -E '/bin/ckptctl$' <<<"$files" | head -1)
check "the installed ckptctl runs against the installed libckpt" \
  bash -c "LD_LIBRARY_PATH='$tmp$lib' '$tmp$ctl' --version | grep -q '^ckptctl '"
[ $bad -eq 0 ] || { echo "# installed:"; sed 's/^/#   /' <<<"$files"; }
exit $bad
