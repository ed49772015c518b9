# LIO with an iSER portal (ib_isert) for the kernel lab, through rtslib-fb: FILE as a fileio
# LUN 0 of iqn.2003-01.org.linux-iscsi.lab:lio-iser, open ACL, the portal ADDR:PORT with
# iSER switched on (the portal's configfs `iser` attribute). Prints "LIO iSER up" when set.
import sys

from rtslib_fb import LUN, TPG, FabricModule, FileIOStorageObject, NetworkPortal, Target

path, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = FileIOStorageObject("iser0", path, size=256 << 20, write_back=False)
target = Target(FabricModule("iscsi"), "iqn.2003-01.org.linux-iscsi.lab:lio-iser")
tpg = TPG(target, 1)
LUN(tpg, 0, storage)
portal = NetworkPortal(tpg, addr, port)
portal.iser = True
for key, value in (
    ("generate_node_acls", "1"),
    ("demo_mode_write_protect", "0"),
    ("authentication", "0"),
    ("cache_dynamic_acls", "1"),
):
    tpg.set_attribute(key, value)
tpg.enable = True
print("LIO iSER up on", addr, port, "iser =", portal.iser)
