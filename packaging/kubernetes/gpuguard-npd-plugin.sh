#!/bin/sh
# gpuguard's node-problem-detector custom plugin (docs/kubernetes.md). POSIX sh and its
# built-ins only: NPD's image has a shell, not Python.
#
#   gpuguard-npd-plugin.sh FILE
#
# FILE is one condition's verdict, written atomically by `gpuguard daemon --npd-dir DIR`
# after every cycle (gpu-hardware, gpu-driver, gpu-fabric, gpu-service): key=value lines
# (status, message, boottime, max_age_s, and since issue 27 boottime_cs, max_age_cs: the
# same in centiseconds, read when present). NPD's contract: exit 0 OK, 1 NonOK,
# 2 Unknown, one line of output, which NPD cuts at 80 characters (so does this script).
#
# Never OK on a guess: a missing, unreadable or malformed file, a file older than its
# max_age (the time until a result in it is older than two cycles of its cadence;
# boottime against /proc/uptime: the same clock, CLOCK_BOOTTIME, which no wall-clock
# change moves), a file from before the last reboot, an unknown status: all Unknown (2).
# The daemon writes unknown for a condition holding an unknown and no critical, also
# beside a warning. A warning alone is OK (0) with the warning named: only critical sets
# the condition, as only critical drains a Slurm node.
# GPUGUARD_UPTIME_FILE replaces /proc/uptime (the tests' clock).

say() {  # EXIT-CODE MESSAGE: one line, at most 80 bytes
    printf '%.80s\n' "$2"
    exit "$1"
}

file=${1:-}
[ -n "$file" ] || say 2 "gpuguard: usage: gpuguard-npd-plugin.sh VERDICT-FILE"
name=${file##*/}
# a regular file only: a FIFO would block the read past NPD's timeout
[ -f "$file" ] && [ -r "$file" ] || say 2 "gpuguard: no verdict for $name: is the daemon running?"

status='' message='' boottime='' max_age='' boottime_cs='' max_age_cs=''
n=0
while [ "$n" -lt 8 ] && IFS= read -r line; do
    n=$((n + 1))
    case $line in
        status=*) status=${line#status=} ;;
        message=*) message=${line#message=} ;;
        boottime=*) boottime=${line#boottime=} ;;
        max_age_s=*) max_age=${line#max_age_s=} ;;
        boottime_cs=*) boottime_cs=${line#boottime_cs=} ;;
        max_age_cs=*) max_age_cs=${line#max_age_cs=} ;;
    esac
done < "$file"

number() { case $1 in '' | *[!0-9]*) return 1 ;; esac; }
number "$boottime" && number "$max_age" || say 2 "gpuguard: unreadable verdict for $name"

uptime_file=${GPUGUARD_UPTIME_FILE:-/proc/uptime}
read -r up _ < "$uptime_file" 2>/dev/null || say 2 "gpuguard: cannot read $uptime_file"
now=${up%%.*}
number "$now" || say 2 "gpuguard: cannot read $uptime_file"

if [ -n "$boottime_cs$max_age_cs" ]; then
    # centiseconds, as /proc/uptime prints them: two cycles of 0.5 s are one second
    number "$boottime_cs" && number "$max_age_cs" || say 2 "gpuguard: unreadable verdict for $name"
    cs=${up#"$now"}
    cs=${cs#.}
    case $cs in
        [0-9][0-9]*) cs=${cs%"${cs#??}"} ;;
        [0-9]) cs=${cs}0 ;;
        *) cs=00 ;;
    esac
    age=$((now * 100 + ${cs#0} - boottime_cs))
    max=$max_age_cs
else
    age=$(((now - boottime) * 100))
    max=$((max_age * 100))
fi
seconds() { # centiseconds as seconds: 1100 is 11s, 231 is 2.31s
    if [ $(($1 % 100)) -eq 0 ]; then printf '%d' $(($1 / 100))
    else printf '%d.%02d' $(($1 / 100)) $(($1 % 100)); fi
}
[ "$age" -ge 0 ] || say 2 "gpuguard: verdict for $name is from before this boot: stale"
[ "$age" -le "$max" ] ||
    say 2 "gpuguard: verdict for $name is $(seconds "$age")s old (max $(seconds "$max")s): stale"

case $status in
    ok | warning) say 0 "gpuguard: $message" ;;
    critical) say 1 "gpuguard: $message" ;;
    *) say 2 "gpuguard: $message" ;;
esac
