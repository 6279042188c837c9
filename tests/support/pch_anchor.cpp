// Anchors the shared precompiled header target (see cmake/AccelerateDevelopment.cmake).
