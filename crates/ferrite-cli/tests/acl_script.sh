set -u
cd "$1"
echo secret > f && chmod 600 f && setfacl -m u:1000:r f && getfacl -cn f; stat -c %A f
chmod 640 f; getfacl -cn f
setpriv --reuid=1000 --regid=1000 --clear-groups cat f 2>&1
setfacl -b f; getfacl -cn f; stat -c %A f
setpriv --reuid=1000 --regid=1000 --clear-groups cat f 2>&1
mkdir d && setfacl -d -m u:1000:rwx,g::r-x d && (umask 077 && touch d/x && mkdir d/y && ln -s x d/l) && getfacl -cn d/x d/y; stat -c "%n %A" d/x d/y
setfacl -m m::r d/x; stat -c %A d/x; getfacl -cn d/x
setfacl -m u::rwx,g::r,o::- d/y 2>&1; stat -c %A d/y
setfacl -x d:u:1000 d; getfacl -cn d
setfacl -k d; getfacl -cn d
touch g; setfacl -d -m u::rwx g 2>&1
setfacl -m u:1000:rw g; chown 5 g; getfacl -cn g; 
mkdir sg; chmod 2770 sg; chgrp 50 sg; setpriv --reuid=1000 --regid=1000 --clear-groups touch sg/z 2>&1
setfacl -m u:1000:rwx sg; setpriv --reuid=1000 --regid=1000 --clear-groups touch sg/z 2>&1; stat -c "%n %u %g %A" sg/z
