#!/bin/bash
# Run the commands of research/queue.txt one at a time (first line first), each logged to
# research/logs/<n>.log; a command is removed from the queue when it starts. Stops when the queue is empty.
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
while true; do
  line=$(head -n 1 research/queue.txt 2>/dev/null)
  [ -z "$line" ] && break
  sed -i '1d' research/queue.txt
  name=$(echo "$line" | awk '{print $1}')
  cmd=$(echo "$line" | cut -d' ' -f2-)
  echo "$(date +%T) start $name: $cmd" >> research/logs/queue.log
  /usr/bin/time -f "%U user %S sys %e wall" nice -n 5 bash -c "$cmd" > "research/logs/$name.log" 2>&1
  echo "$(date +%T) done $name rc=$?" >> research/logs/queue.log
done
