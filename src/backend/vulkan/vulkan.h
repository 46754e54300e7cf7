/*
 * vulkan.h - the Vulkan compute backend (src/backend/vulkan/), in builds with Vulkan
 * (DSV4_HAVE_VULKAN; the Makefile's VULKAN switch). registry.c lists it; nothing else
 * names it.
 */
#ifndef DSV4_VULKAN_H
#define DSV4_VULKAN_H

#include "backend/backend.h"

extern const struct dsv4_backend_kind dsv4_backend_vulkan;

#endif /* DSV4_VULKAN_H */
